"""The HTTP listener (``http.listen``): ChatService over the Connect protocol and gRPC-Web, and
the base of every HTTP door (docs/http.md). The doors call the gRPC server's own interceptors
and servicers in process; the engine knows nothing of HTTP.

Modules: ``settings`` (the ``http:`` section; imports no server library, so reading the
configuration stays light), ``calls`` (:class:`~turnwire_server.http.calls.InProcessCalls`:
a method called through the gRPC server's interceptors), ``doors`` (a door is a set of routes;
the application with CORS), ``connect_door`` (Connect and gRPC-Web, by connectrpc), ``server``
(:func:`~turnwire_server.http.server.start_http`: uvicorn in the sidecar's loop)."""
