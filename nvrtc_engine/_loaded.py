"""When this process imported nvrtc_engine (the key index trusts no file modified later)."""

import time

IMPORTED_AT = time.time()
