"""A real OAuth 2.0 authorization server for the integration tests: django-oauth-toolkit.

    python oauth_server.py --port 0 --db /tmp/x.sqlite3 --lifetime 5 --client api:s3cret [--client …]

Serves on 127.0.0.1 only, and prints `listening 127.0.0.1:PORT` once ready. Routes:

- `POST /o/token/`: django-oauth-toolkit's token endpoint (client_credentials; client_secret_basic
  and client_secret_post);
- `GET /api/hello`: a resource protected by django-oauth-toolkit, to prove a served token works;
- `POST /pkjwt/token`: a small endpoint for `private_key_jwt` (RFC 7523), which
  django-oauth-toolkit does not support: it verifies the client assertion with PyJWT against
  the public key given by `--pkjwt-key client_id:public.pem`, and issues a random token;
- `GET|POST /custom/token`: a generic JSON token service, `{"data": {"token": …, "ttl": …}}`, that
  wants the header `X-Api-Key` (`--api-key`);
- `GET /stats`: how many token requests each route answered, by status: counted at the issuer;
- `POST /faults` `{"mode": M, "retry_after": S}`: makes `/o/token/` misbehave until mode `none`:
  `hang` (no answer while the fault lasts, then the connection is closed), `slow`
  (headers at once, then the body a byte every 0.2 s), `5xx` (503), `429` (with `Retry-After: S`),
  `garbage` (200 with a body that is not JSON);
- `POST /rotate` `{"client_id": C, "secret": S}`: gives a client a new secret, as an operator would;
- `GET /attempts`: the arrival time (`time.time()`) and outcome of every `/o/token/` request;
- `GET /token-requests`: what each token request asked for and got, for the tests of provider
  templates: per `/o/token/` request that reached django-oauth-toolkit, its form's `audience`,
  `scope` and `resource` values (lists: a field may repeat), the status, the scope issued and the
  SHA-256 (hex) of the access token issued; per `/custom/token` request, its query, its `X-…`
  headers but the API key, its body and the SHA-256 of the token issued. Never a secret.

django-oauth-toolkit ignores form fields it does not know (`audience`), checks `scope` against
SCOPES, and keeps `resource` (RFC 8707, an absolute URI) on the token it issues. Token requests
are answered one at a time: SQLite takes one writer at once, and a "database is locked" 500
under concurrent requests would be a retry the tests would count as a second fetch.
"""
import argparse
import hashlib
import io
import json
import os
import secrets
import sys
import threading
import time
from socketserver import ThreadingMixIn
from urllib.parse import parse_qs
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

import django
from django.conf import settings

parser = argparse.ArgumentParser()
parser.add_argument("--port", type=int, default=0)
parser.add_argument("--db", required=True)
parser.add_argument("--lifetime", type=int, default=5)
parser.add_argument("--client", action="append", default=[], help="client_id:secret")
parser.add_argument("--pkjwt-key", action="append", default=[], help="client_id:public-key.pem")
parser.add_argument("--api-key", default="")
options = parser.parse_args()

settings.configure(
    DEBUG=False,
    SECRET_KEY=secrets.token_hex(32),
    ALLOWED_HOSTS=["127.0.0.1", "localhost"],
    INSTALLED_APPS=["django.contrib.contenttypes", "django.contrib.auth", "oauth2_provider"],
    MIDDLEWARE=[],
    ROOT_URLCONF=__name__,
    DATABASES={"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": options.db}},
    USE_TZ=True,
    OAUTH2_PROVIDER={"ACCESS_TOKEN_EXPIRE_SECONDS": options.lifetime, "SCOPES": {"read": "read", "write": "write", "api": "api"}},
    LOGGING_CONFIG=None,
    # Client secrets are stored hashed; Django 5.2's PBKDF2 (a million rounds) takes about half a
    # second per client authentication here, as long as the fault tests' upstream timeout. The
    # hasher Django's own docs suggest for tests keeps a wrong secret a wrong secret, quickly.
    PASSWORD_HASHERS=["django.contrib.auth.hashers.MD5PasswordHasher"],
)
django.setup()

import jwt  # noqa: E402
from django.core.management import call_command  # noqa: E402
from django.http import HttpResponse, JsonResponse  # noqa: E402
from django.urls import include, path  # noqa: E402
from django.views.decorators.csrf import csrf_exempt  # noqa: E402
from oauth2_provider.models import Application  # noqa: E402
from oauth2_provider.views import ProtectedResourceView  # noqa: E402

STATS = {}
STATS_LOCK = threading.Lock()
SEEN_JTI = set()
FAULT = {"mode": "none", "retry_after": 1}
ATTEMPTS = []
TOKEN_REQUESTS = []
# One token request at a time reaches django-oauth-toolkit (see the module's doc comment).
ISSUING = threading.Lock()


def count(route, status):
    with STATS_LOCK:
        STATS.setdefault(route, {}).setdefault(str(status), 0)
        STATS[route][str(status)] += 1


class Hello(ProtectedResourceView):
    def get(self, request, *args, **kwargs):
        return JsonResponse({"hello": "world"})


@csrf_exempt
def pkjwt_token(request):
    """Verifies a private_key_jwt client assertion with PyJWT, then issues a token."""
    keys = dict(entry.split(":", 1) for entry in options.pkjwt_key)
    form = request.POST
    client_id = form.get("client_id", "")
    problem = None
    if form.get("grant_type") != "client_credentials":
        problem = "unsupported_grant_type"
    elif form.get("client_assertion_type") != "urn:ietf:params:oauth:client-assertion-type:jwt-bearer" or client_id not in keys:
        problem = "invalid_client"
    else:
        with open(keys[client_id], "rb") as handle:
            public_key = handle.read()
        audience = f"http://{request.get_host()}/pkjwt/token"
        try:
            claims = jwt.decode(form.get("client_assertion", ""), public_key, algorithms=["RS256", "ES256"], audience=audience,
                                issuer=client_id, options={"require": ["exp", "iat", "jti", "sub"]})
            if claims["sub"] != client_id or claims["exp"] - claims["iat"] > 300 or claims["jti"] in SEEN_JTI:
                problem = "invalid_client"
            SEEN_JTI.add(claims["jti"])
        except jwt.PyJWTError:
            problem = "invalid_client"
    if problem:
        count("pkjwt", 401)
        return JsonResponse({"error": problem}, status=401)
    count("pkjwt", 200)
    return JsonResponse({"access_token": secrets.token_urlsafe(24), "token_type": "bearer", "expires_in": options.lifetime})


def sha256(text):
    return hashlib.sha256(text.encode()).hexdigest()


@csrf_exempt
def custom_token(request):
    record = {"at": time.time(), "route": "custom", "method": request.method, "query": {k: request.GET.getlist(k) for k in request.GET},
              "headers": {k: v for k, v in request.headers.items() if k.lower().startswith("x-") and k.lower() != "x-api-key"},
              "body": request.body.decode(errors="replace")}
    if not options.api_key or request.headers.get("X-Api-Key") != options.api_key:
        count("custom", 403)
        with STATS_LOCK:
            TOKEN_REQUESTS.append({**record, "status": 403})
        return HttpResponse(status=403)
    count("custom", 200)
    token = "custom-" + secrets.token_urlsafe(16)
    with STATS_LOCK:
        TOKEN_REQUESTS.append({**record, "status": 200, "token_sha256": sha256(token)})
    return JsonResponse({"data": {"token": token, "ttl": options.lifetime}})


def stats(request):
    with STATS_LOCK:
        return JsonResponse(STATS)


@csrf_exempt
def faults(request):
    wanted = json.loads(request.body)
    if wanted.get("mode") not in ("none", "hang", "slow", "5xx", "429", "garbage"):
        return JsonResponse({"error": "unknown mode"}, status=400)
    with STATS_LOCK:
        FAULT.update(wanted)
    return JsonResponse(FAULT)


@csrf_exempt
def rotate(request):
    wanted = json.loads(request.body)
    application = Application.objects.get(client_id=wanted["client_id"])
    application.client_secret = wanted["secret"]
    application.save()
    return JsonResponse({"rotated": application.client_id})


def attempts(request):
    with STATS_LOCK:
        return JsonResponse({"attempts": ATTEMPTS})


def token_requests(request):
    with STATS_LOCK:
        return JsonResponse({"requests": TOKEN_REQUESTS})


urlpatterns = [
    path("o/", include("oauth2_provider.urls", namespace="oauth2_provider")),
    path("api/hello", Hello.as_view()),
    path("pkjwt/token", pkjwt_token),
    path("custom/token", custom_token),
    path("stats", stats),
    path("faults", faults),
    path("rotate", rotate),
    path("attempts", attempts),
    path("token-requests", token_requests),
]


def counting(application):
    """Counts the answers of django-oauth-toolkit's token endpoint, as the issuer sees them, and
    plays the fault set by `POST /faults` instead of answering."""

    def wrapped(environ, start_response):
        if environ.get("PATH_INFO") != "/o/token/":
            return application(environ, start_response)
        with STATS_LOCK:
            mode, retry_after = FAULT["mode"], FAULT["retry_after"]
            attempt = [time.time(), mode]
            ATTEMPTS.append(attempt)
        if mode != "none":
            count("oauth2", mode)
            return play(mode, retry_after, environ, start_response)

        form = read_form(environ)
        answer = {}

        def start(status, headers, exc_info=None):
            count("oauth2", int(status.split()[0]))
            attempt[1] = answer["status"] = int(status.split()[0])
            return start_response(status, headers, exc_info)

        with ISSUING:
            body = b"".join(application(environ, start))
        record_token_request(attempt[0], form, answer.get("status"), body)
        return [body]

    return wrapped


def read_form(environ):
    """The token request's form fields, read from its body, which is then handed on unread."""
    try:
        length = int(environ.get("CONTENT_LENGTH") or 0)
    except ValueError:
        length = 0
    body = environ["wsgi.input"].read(length) if length > 0 else b""
    environ["wsgi.input"] = io.BytesIO(body)
    return parse_qs(body.decode("latin-1"), keep_blank_values=True)


def record_token_request(at, form, status, body):
    """Keeps what a token request asked for (`audience`, `scope`, `resource`) and what it got."""
    record = {"at": at, "route": "oauth2", "status": status,
              "audience": form.get("audience", []), "scope": form.get("scope", []), "resource": form.get("resource", [])}
    try:
        issued = json.loads(body)
    except ValueError:
        issued = {}
    if isinstance(issued, dict) and isinstance(issued.get("access_token"), str):
        record["token_sha256"] = sha256(issued["access_token"])
        record["issued_scope"] = issued.get("scope")
    with STATS_LOCK:
        TOKEN_REQUESTS.append(record)


def play(mode, retry_after, environ, start_response):
    if mode == "5xx":
        start_response("503 Service Unavailable", [("Content-Type", "application/json")])
        return [b'{"error":"temporarily_unavailable"}']
    if mode == "429":
        start_response("429 Too Many Requests", [("Content-Type", "application/json"), ("Retry-After", str(retry_after))])
        return [b'{"error":"slow_down"}']
    if mode == "garbage":
        start_response("200 OK", [("Content-Type", "application/json")])
        return [b"<html>\x00\xff not a token"]
    # slow: a valid-looking answer, one byte every 0.2 s, for as long as the fault lasts (at most 30 s).
    start_response("200 OK", [("Content-Type", "application/json")])

    def trickle():
        deadline = time.monotonic() + 30
        for byte in b'{"access_token":"slow-token-that-never-finishes","token_type":"Bearer","expires_in":60}':
            if FAULT["mode"] != "slow" or time.monotonic() > deadline:
                return
            time.sleep(0.2)
            yield bytes([byte])

    return trickle()


class QuietHandler(WSGIRequestHandler):
    def log_message(self, *args):
        pass

    def handle(self):
        """WSGIRequestHandler.handle, except that a `hang` fault holds a token request unanswered."""
        from wsgiref.simple_server import ServerHandler

        self.raw_requestline = self.rfile.readline(65537)
        if len(self.raw_requestline) > 65536 or not self.parse_request():
            return
        if self.path.startswith("/o/token/") and FAULT["mode"] == "hang":
            with STATS_LOCK:
                ATTEMPTS.append([time.time(), "hang"])
            count("oauth2", "hang")
            deadline = time.monotonic() + 30
            while FAULT["mode"] == "hang" and time.monotonic() < deadline:
                time.sleep(0.05)
            self.close_connection = True
            return
        handler = ServerHandler(self.rfile, self.wfile, self.get_stderr(), self.get_environ(), multithread=True)
        handler.request_handler = self
        handler.run(self.server.get_app())


class Server(ThreadingMixIn, WSGIServer):
    daemon_threads = True
    allow_reuse_address = True

    def handle_error(self, request, client_address):
        pass  # a client that went away, such as a broker that timed out


def main():
    call_command("migrate", verbosity=0)
    for entry in options.client:
        client_id, secret = entry.split(":", 1)
        if not Application.objects.filter(client_id=client_id).exists():
            Application.objects.create(
                name=client_id, client_id=client_id, client_secret=secret,
                client_type=Application.CLIENT_CONFIDENTIAL, authorization_grant_type=Application.GRANT_CLIENT_CREDENTIALS)
    from django.core.wsgi import get_wsgi_application

    server = make_server("127.0.0.1", options.port, counting(get_wsgi_application()), server_class=Server, handler_class=QuietHandler)
    print(f"listening 127.0.0.1:{server.server_port}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
