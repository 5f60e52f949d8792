"""dgxmm's front door: the HTTP server every request passes through, admin API and gateway alike.

``limits`` says how much a client may hold (connections, header bytes, time), ``connections``
keeps the count of open connections, ``protocol`` enforces the limits while it parses, and
``server`` builds the one uvicorn server that both ``dgxmm serve`` and the tests run, with its
graceful shutdown. See docs/server.md.
"""
