"""The `crossintercom` command line (click): the top layer, over the client, relay and tools."""
