"""Hindsight settings, read from the environment.

With nothing set, the embedded default runs everything on one machine with Python alone: SQLite
under ``var/`` and ingest tasks in-process. Set ``DATABASE_URL`` (PostgreSQL) and
``CELERY_BROKER_URL`` (Redis) for production. ``.env.example`` documents every variable.

Importing this module writes nothing: the data directory and the embedded default's stored
secret key are made when Django starts (``hindsight.apps``).
"""

from __future__ import annotations

import os
from pathlib import Path

import dj_database_url
import plotly
from django.core.exceptions import ImproperlyConfigured

BASE_DIR = Path(__file__).resolve().parent.parent


def env_str(name: str, default: str = "") -> str:
    return os.environ.get(name, default)


def env_bool(name: str, default: bool) -> bool:
    value = os.environ.get(name)
    if value is None or value == "":
        return default
    if value.lower() in ("1", "true", "yes", "on"):
        return True
    if value.lower() in ("0", "false", "no", "off"):
        return False
    raise ImproperlyConfigured(f"{name} must be a boolean (true/false), not {value!r}")


def env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    if value is None or value == "":
        return default
    try:
        return int(value)
    except ValueError:
        raise ImproperlyConfigured(f"{name} must be an integer, not {value!r}") from None


def env_list(name: str, default: str = "") -> list[str]:
    return [item.strip() for item in os.environ.get(name, default).split(",") if item.strip()]


def env_header(name: str) -> tuple[str, str] | None:
    """A request header and the value that means HTTPS, as ``HTTP_X_FORWARDED_PROTO,https``."""
    value = os.environ.get(name, "")
    if not value:
        return None
    header, _, expected = (part.strip() for part in value.partition(","))
    if not header.startswith("HTTP_") or not expected:
        raise ImproperlyConfigured(
            f"{name} must look like HTTP_X_FORWARDED_PROTO,https, not {value!r}")
    return header, expected


def env_rate(name: str, default: str) -> str | None:
    """A DRF throttle rate such as ``1200/min`` (``N/s``, ``N/min``, ``N/hour``, ``N/day``);
    ``off`` disables the limit."""
    value = os.environ.get(name) or default
    if value.lower() == "off":
        return None
    count, _, period = value.partition("/")
    if not (count.isdigit() and period[:1] in ("s", "m", "h", "d")):
        raise ImproperlyConfigured(f"{name} must look like 1200/min (or be off), not {value!r}")
    return value


DEBUG = env_bool("DEBUG", False)
# Absolute links in API answers and `ingest --json` use this base when there is no request.
SITE_URL = env_str("SITE_URL", "http://127.0.0.1:8000").rstrip("/")
# A site whose public address is https:// is a production site: it needs its own SECRET_KEY, and
# the security settings below default to what HTTPS allows. Over plain HTTP (the embedded
# default, compose on localhost) they stay off, or the browser would drop the session cookie.
HTTPS = SITE_URL.startswith("https://")
DATA_DIR = Path(env_str("HINDSIGHT_DATA_DIR", str(BASE_DIR / "var")))
SECRET_KEY_FILE = DATA_DIR / "secret_key"
SECRET_KEY = env_str("SECRET_KEY")
if not SECRET_KEY and HTTPS:
    raise ImproperlyConfigured("SECRET_KEY must be set for a site served over HTTPS (SITE_URL "
                               f"{SITE_URL}); see .env.example")
if not SECRET_KEY:
    # The embedded default keeps a key per data directory so that sessions survive restarts:
    # read here, made and stored at startup (hindsight.apps) when there is none yet.
    if SECRET_KEY_FILE.is_file():
        SECRET_KEY = SECRET_KEY_FILE.read_text().strip()
    else:
        import secrets

        SECRET_KEY = secrets.token_urlsafe(50)
ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", "localhost,127.0.0.1,[::1]")
CSRF_TRUSTED_ORIGINS = env_list("CSRF_TRUSTED_ORIGINS")

# HTTPS. Behind a proxy that ends TLS, SECURE_PROXY_SSL_HEADER names the header it sets (only if
# it always sets it, overwriting the client's), or every request looks like plain HTTP.
SECURE_PROXY_SSL_HEADER = env_header("SECURE_PROXY_SSL_HEADER")
SECURE_SSL_REDIRECT = env_bool("SECURE_SSL_REDIRECT", HTTPS)
# The container healthcheck asks over plain HTTP from inside (docker-compose.yml).
SECURE_REDIRECT_EXEMPT = [r"^healthz$"]
SESSION_COOKIE_SECURE = env_bool("SESSION_COOKIE_SECURE", HTTPS)
CSRF_COOKIE_SECURE = env_bool("CSRF_COOKIE_SECURE", HTTPS)
SECURE_HSTS_SECONDS = env_int("SECURE_HSTS_SECONDS", 365 * 24 * 3600 if HTTPS else 0)
# Both promise more than this site: every subdomain over HTTPS; preload, for months after.
SECURE_HSTS_INCLUDE_SUBDOMAINS = env_bool("SECURE_HSTS_INCLUDE_SUBDOMAINS", False)
SECURE_HSTS_PRELOAD = env_bool("SECURE_HSTS_PRELOAD", False)

INSTALLED_APPS = [
    "hindsight.apps.HindsightConfig",  # makes the data directory at startup
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "django_filters",
    "drf_spectacular",
    "drf_spectacular_sidecar",  # Swagger UI served by us, never from a CDN
    "incidents",
    "timelines",
    "streams",
    "timelines.detections",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    # who a session that opened share links is; re-checks the links on every request
    "incidents.middleware.ShareLinkMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "hindsight.urls"
WSGI_APPLICATION = "hindsight.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "hindsight.context_processors.plotly_js",
            ],
        },
    },
]

DATABASE_URL = env_str("DATABASE_URL")
if DATABASE_URL:
    DATABASES = {"default": dj_database_url.parse(DATABASE_URL, conn_max_age=60)}
    if DATABASES["default"]["ENGINE"] != "django.db.backends.postgresql":
        raise ImproperlyConfigured("DATABASE_URL must point at PostgreSQL (postgres://…)")
else:
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": DATA_DIR / "hindsight.sqlite3",
            # WAL lets the page read while an in-process ingest thread writes; IMMEDIATE avoids
            # the deadlock-prone lock upgrade of deferred transactions.
            "OPTIONS": {
                "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
                "transaction_mode": "IMMEDIATE",
                "timeout": 30,
            },
            # A file, not memory: the in-process ingest thread must see what tests write.
            "TEST": {"NAME": str(DATA_DIR / "test.sqlite3")},
        }
    }
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
]
LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "incidents:list"
LOGOUT_REDIRECT_URL = "login"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True

STATIC_URL = "static/"
# plotly.js is served by us, never from a CDN, never copied into the repository. The incident
# page loads PLOTLY_JS: a bundle of only the trace types it draws (1.5 MB instead of 4.8 MB, so
# the browser compiles less before the first paint), built from npm by scripts/assets.sh into
# assets/dist/; without it (no npm), the plotly package's full plotly.min.js.
STATICFILES_DIRS = [BASE_DIR / "static",
                    ("plotly", Path(plotly.__file__).resolve().parent / "package_data")]
PLOTLY_JS = "plotly/plotly.min.js"
if (BASE_DIR / "assets" / "dist" / "plotly-timeline.min.js").is_file():
    STATICFILES_DIRS.append(("plotly", BASE_DIR / "assets" / "dist"))
    PLOTLY_JS = "plotly/plotly-timeline.min.js"
STATIC_ROOT = DATA_DIR / "static"  # made at startup: WhiteNoise warns about a missing one
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "whitenoise.storage.CompressedStaticFilesStorage"},
}
if DEBUG:
    STORAGES["staticfiles"] = {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"}
WHITENOISE_USE_FINDERS = True

# Uploaded files wait here until a worker has ingested them; web and worker must share it.
UPLOAD_DIR = Path(env_str("HINDSIGHT_UPLOAD_DIR", str(DATA_DIR / "uploads")))
# Column indexes of large incidents (timelines/store/columns.py): web and worker processes
# share them.
COLUMNS_DIR = Path(env_str("HINDSIGHT_COLUMNS_DIR", str(DATA_DIR / "columns")))
MAX_UPLOAD_BYTES = env_int("HINDSIGHT_MAX_UPLOAD_BYTES", 2 * 1024**3)
# Files up to this size are read into memory; larger ones stream to a temporary file in
# FILE_UPLOAD_TEMP_DIR as they arrive and are then moved (renamed) into UPLOAD_DIR, so a big
# upload is never whole in memory.
FILE_UPLOAD_MAX_MEMORY_SIZE = 2 * 1024**2
FILE_UPLOAD_HANDLERS = [
    "django.core.files.uploadhandler.MemoryFileUploadHandler",
    "django.core.files.uploadhandler.TemporaryFileUploadHandler",
]
DATA_UPLOAD_MAX_MEMORY_SIZE = 10 * 1024**2
FILE_UPLOAD_TEMP_DIR = None

# Diagnose bundles: limits on what one bundle may unpack to (bombs and hostile archives fail the
# entry that breaks them, not the bundle).
BUNDLE_MAX_BYTES = env_int("HINDSIGHT_BUNDLE_MAX_BYTES", 20 * 1024**3)
BUNDLE_MAX_FILES = env_int("HINDSIGHT_BUNDLE_MAX_FILES", 100_000)
BUNDLE_MAX_RATIO = env_int("HINDSIGHT_BUNDLE_MAX_RATIO", 200)

# ``manage.py ingest`` loads a new incident of at least this many bytes into a table of its own,
# indexed once at the end (timelines/ingest/bulk.py): faster than keeping the indexes row by row.
BULK_LOAD_MIN_BYTES = env_int("HINDSIGHT_BULK_LOAD_MIN_BYTES", 64 * 1024**2)

# Redaction: on by default. Extra dotted JSON paths (``*`` matches one key or list item), e.g.
# ``requestObject.spec.template.spec.containers.*.env.*.value``.
REDACT = env_bool("HINDSIGHT_REDACT", True)
REDACT_EXTRA_PATHS = env_list("HINDSIGHT_REDACT_PATHS")

# Audit webhook streams (streams/): the largest batch taken (413 above it), and how many batches
# one web process stores at once; a batch that waits STREAM_QUEUE_SECONDS for its turn answers
# 429 with Retry-After (kube-apiserver backs off and sends it again).
STREAM_MAX_BATCH_BYTES = env_int("HINDSIGHT_STREAM_MAX_BATCH_BYTES", 64 * 1024**2)
STREAM_CONCURRENCY = env_int("HINDSIGHT_STREAM_CONCURRENCY", 4)
STREAM_QUEUE_SECONDS = 2.0
STREAM_RETRY_AFTER = 1
# Without a broker, where a web process runs the Falco rules over the batches it acknowledged:
# "process" (on PostgreSQL): a child process at the lowest CPU priority (streams/detector.py);
# "thread": a thread of the web process, which gives way to the receivers (always on SQLite).
STREAM_DETECTIONS = env_str("HINDSIGHT_STREAM_DETECTIONS", "process")
if STREAM_DETECTIONS not in ("process", "thread"):
    raise ImproperlyConfigured(
        f"HINDSIGHT_STREAM_DETECTIONS must be process or thread, not {STREAM_DETECTIONS!r}")

# Celery. Without a broker the embedded default runs ingest in a thread of the same process.
CELERY_BROKER_URL = env_str("CELERY_BROKER_URL")
CELERY_RESULT_BACKEND = None
CELERY_TASK_DEFAULT_QUEUE = env_str("HINDSIGHT_QUEUE", "celery")  # where ingest tasks go
CELERY_TASK_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
# A broker restart must not cancel a running ingest (Celery 6's default would): the ingest goes on
# and the worker reconnects (timelines/tests/test_faults.py restarts Redis mid-ingest).
CELERY_WORKER_CANCEL_LONG_RUNNING_TASKS_ON_CONNECTION_LOSS = False
CELERY_TASK_TIME_LIMIT = env_int("HINDSIGHT_TASK_TIME_LIMIT", 6 * 3600)
CELERY_TASK_SOFT_TIME_LIMIT = CELERY_TASK_TIME_LIMIT - 60
# With acks_late, a task that outlives the visibility timeout is delivered again; keep it above
# the time limit so only a lost worker causes redelivery.
CELERY_BROKER_TRANSPORT_OPTIONS = {"visibility_timeout": CELERY_TASK_TIME_LIMIT + 600}
CELERY_BEAT_SCHEDULE = {
    "requeue-stale-uploads": {"task": "timelines.tasks.requeue_stale_uploads", "schedule": 60.0},
    # purges of deleted incidents that were lost (timelines.ingest.purge)
    "requeue-lost-purges": {"task": "timelines.tasks.requeue_lost_purges", "schedule": 300.0},
    # audit webhook streams: slots past their retention emptied (streams.store.apply_retention)
    "stream-retention": {"task": "streams.tasks.apply_stream_retention", "schedule": 300.0},
}
# A web process does at start what its first request would (hindsight/warmup.py), so that the
# first request is as fast as the next ones.
WARM_UP = env_bool("HINDSIGHT_WARM_UP", True)
# An upload whose worker has not reported progress for this long is taken to be lost.
UPLOAD_STALE_SECONDS = env_int("HINDSIGHT_UPLOAD_STALE_SECONDS", 300)
UPLOAD_MAX_ATTEMPTS = env_int("HINDSIGHT_UPLOAD_MAX_ATTEMPTS", 3)

# Cache: request rate counters (and whatever else wants a cache) must be shared by every web
# process, so it is Redis whenever there is one: CACHE_URL, else the Celery broker's Redis.
CACHE_URL = env_str("CACHE_URL")
if not CACHE_URL and CELERY_BROKER_URL.startswith(("redis://", "rediss://")):
    CACHE_URL = CELERY_BROKER_URL
if CACHE_URL:
    if not CACHE_URL.startswith(("redis://", "rediss://", "unix://")):
        raise ImproperlyConfigured("CACHE_URL must be a Redis URL (redis://host:6379/1)")
    CACHES = {"default": {"BACKEND": "django.core.cache.backends.redis.RedisCache",
                          "LOCATION": CACHE_URL, "KEY_PREFIX": "hindsight"}}
else:  # the embedded default: one process
    CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "incidents.auth.ApiTokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": [
        "rest_framework.permissions.IsAuthenticated",
        "incidents.auth.TokenScope",
    ],
    "DEFAULT_FILTER_BACKENDS": ["django_filters.rest_framework.DjangoFilterBackend"],
    "DEFAULT_THROTTLE_CLASSES": ["incidents.auth.ApiRateThrottle"],
    "DEFAULT_THROTTLE_RATES": {
        "api": env_rate("HINDSIGHT_API_RATE", "1200/min"),
        "upload": env_rate("HINDSIGHT_UPLOAD_RATE", "60/min"),
    },
    # Behind a proxy, throttling by client address needs the X-Forwarded-For hop count; 0
    # trusts no X-Forwarded-For (a client could forge it).
    "NUM_PROXIES": env_int("HINDSIGHT_NUM_PROXIES", 0),
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    # The URL decides the representation: never a 406 (see the module).
    "DEFAULT_CONTENT_NEGOTIATION_CLASS": "hindsight.negotiation.UrlFormatNegotiation",
    # An incident deleted while a request writes to it: 404, not a 500 (incidents.models.writing)
    "EXCEPTION_HANDLER": "hindsight.exceptions.exception_handler",
    "UNAUTHENTICATED_USER": "django.contrib.auth.models.AnonymousUser",
}

# The OpenAPI schema (/api/schema/) and its Swagger UI (/api/docs/) are public: they describe
# the API, not anyone's data, and every endpoint they list still needs a token or a session.
SPECTACULAR_SETTINGS = {
    "TITLE": "Hindsight API",
    "DESCRIPTION": "Kubernetes audit logs and diagnose bundles as incident timelines. "
                   "Authenticate with `Authorization: Token <key>`.",
    "VERSION": "1",
    "SERVE_INCLUDE_SCHEMA": False,
    "SERVE_PERMISSIONS": ["rest_framework.permissions.AllowAny"],
    "SCHEMA_PATH_PREFIX": r"/api/v[0-9]+",
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    # validatorUrl: null keeps Swagger UI from calling validator.swagger.io
    "SWAGGER_UI_SETTINGS": {"deepLinking": True, "validatorUrl": None},
}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "root": {"handlers": ["console"], "level": env_str("LOG_LEVEL", "INFO")},
}
