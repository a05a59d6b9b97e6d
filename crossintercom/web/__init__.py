"""`crossintercom web`: a local page for a human overseer (docs/web.md).

``auth`` (token, CSRF, allowed hosts), ``overseer`` (what the page shows: the human session,
sessions and hosts, the live feed), ``app`` (the Starlette routes), ``serve`` (uvicorn).
Nothing here is imported by the rest of the package; starlette, uvicorn and jinja2 come with
the ``crossintercom[web]`` extra.
"""
