"""Who is connected and who is known: one client connection, the session registry."""
