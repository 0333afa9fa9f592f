"""The web dashboard (`noduslocal dashboard`): a user's own server on 127.0.0.1 that renders
what the daemon tells that user, signed in by a one-time link, tested in a real browser."""
