"""Issuers the integration tests talk to, all on 127.0.0.1: a real OAuth 2.0 server
(django-oauth-toolkit, `oauth_server.py`) and a deliberately broken one (`faulty.py`)."""
