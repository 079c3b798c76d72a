"""The REST API (``/api/v1``): the app factory (:mod:`.app`), one router per resource
(:mod:`.sweeps`, :mod:`.objectives`, :mod:`.health`), dependencies (:mod:`.deps`), the
pydantic resources (:mod:`.schemas`) and RFC 9457 problem documents (:mod:`.errors`)."""
