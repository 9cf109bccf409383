"""API token authentication (``Authorization: Token <key>``), the scope permission, and the
request rate limits."""

from __future__ import annotations

from datetime import timedelta

from django.utils import timezone
from rest_framework import authentication, exceptions, permissions, throttling
from rest_framework.settings import api_settings

from .access import is_person
from .models import ApiToken, hash_token

LAST_USED_RESOLUTION = timedelta(minutes=1)  # avoid a write on every request


class ApiTokenAuthentication(authentication.BaseAuthentication):
    keywords = ("token", "bearer")

    def authenticate(self, request):
        header = authentication.get_authorization_header(request).split()
        if not header or header[0].lower().decode(errors="replace") not in self.keywords:
            return None
        if len(header) != 2:
            raise exceptions.AuthenticationFailed("Authorization header must be 'Token <key>'.")
        key = header[1].decode(errors="replace")
        token = ApiToken.objects.select_related("user").filter(key_hash=hash_token(key)).first()
        if token is None or not token.user.is_active:
            raise exceptions.AuthenticationFailed("Invalid token.")
        if token.expired:
            raise exceptions.AuthenticationFailed(
                f"This API token ({token.prefix}…) expired at {token.expires_at.isoformat()}; "
                "ask for a new one.")
        now = timezone.now()
        if token.last_used_at is None or now - token.last_used_at > LAST_USED_RESOLUTION:
            ApiToken.objects.filter(pk=token.pk).update(last_used_at=now)
        return token.user, token

    def authenticate_header(self, request) -> str:
        return "Token"  # makes DRF answer 401, not 403, to a missing or bad token


class TokenScope(permissions.BasePermission):
    """Upload-only tokens may use only views that declare ``upload_scope_allowed = True``."""

    message = "This token may only upload."

    def has_permission(self, request, view) -> bool:
        token = request.auth
        if isinstance(token, ApiToken) and token.scope == ApiToken.Scope.UPLOAD:
            return getattr(view, "upload_scope_allowed", False)
        return True


class ApiRateThrottle(throttling.SimpleRateThrottle):
    """Every API request: ``HINDSIGHT_API_RATE`` per user (all their tokens and sessions
    together), per client address for anonymous requests and share links. Counted in the
    Django cache, which is Redis when several processes serve the API."""

    scope = "api"

    def get_rate(self) -> str | None:
        # Read at each request, not at import, so that settings overrides (tests) take effect.
        return api_settings.DEFAULT_THROTTLE_RATES.get(self.scope)

    def get_cache_key(self, request, view) -> str:
        user = request.user
        ident = f"user-{user.pk}" if is_person(user) else f"ip-{self.get_ident(request)}"
        return self.cache_format % {"scope": self.scope, "ident": ident}


class UploadRateThrottle(ApiRateThrottle):
    """Creating uploads: ``HINDSIGHT_UPLOAD_RATE``, on top of the API rate."""

    scope = "upload"

    def allow_request(self, request, view) -> bool:
        if request.method != "POST":
            return True
        return super().allow_request(request, view)
