"""Tools on top of the library: prewarming (:mod:`.prewarm`), variant lists
(:mod:`.variants`), bundles (:mod:`.bundle`), the ``nvrtc-engine`` command (:mod:`.cli`) and
its demo (:mod:`.demo`)."""
