"""The one ``clip-gateway`` command: the client's commands and the server's, mounted in main.py."""
