"""llama.cpp's model-management API at the listener's root (``/models``, ``/models/load``,
``/models/unload``) and llama-swap's ``/running``: the routes that clients of many-model servers
read and press (Open WebUI's llama.cpp connection, the ``pi`` agent, Letta Code), served as
requests of the model router's, through the gateway's one entrance."""
