"""The broker's Unix socket: bind, accept who may connect, read frames."""
