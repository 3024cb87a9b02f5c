"""The kernel families, one folder each (spec, host code, configuration, float64 reference),
and ``shared/`` for what several families use (the MXFP8 tiled kernel's host side, block-scale
layouts and outputs, reference helpers). Families import the core, never a tool; the core
finds them through its registry (:mod:`nvrtc_engine.core.registry`), which imports a family
on first use of one of its ops."""
