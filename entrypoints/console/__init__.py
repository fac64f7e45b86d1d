"""`bb console`: a read-only web page of the fleet and of each environment's life, live (SPEC §12).

A client of the service like the command line: it reads through the API and the streams with the
operator's credentials (entrypoints/cli/connection.py), never from the store. `service` reads,
`feeds` turns what the bus says into updates, `views` renders HTML, `server` serves it behind a
token. The page's script and style are in `static/`, served from the package (no CDN)."""
