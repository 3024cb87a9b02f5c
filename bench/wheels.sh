# Sourced by the GPU session scripts: install the carried wheels (.whl/, machines without
# network) into /tmp/site, once per machine and set of wheels, and put them and the checkout
# on PYTHONPATH.
if ls .whl/*.whl >/dev/null 2>&1; then
  if [ "$(ls .whl)" != "$(cat /tmp/site/.wheels 2>/dev/null)" ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target /tmp/site .whl/*.whl || exit 1
    ls .whl > /tmp/site/.wheels
  fi
  export PYTHONPATH=/tmp/site:$PWD
else
  export PYTHONPATH=$PWD
fi
