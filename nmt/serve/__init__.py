"""The HTTP server (``nmt serve``): ``api.py`` reads a request into one job (every field, its check
and its one-line error), ``app.py`` batches jobs from many clients into one search and answers
them, ``process.py`` runs the app (uvicorn, signals, the log) and says when the process runs
short of file descriptors; ``static/`` the page."""
