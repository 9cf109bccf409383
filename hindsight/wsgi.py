import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "hindsight.settings")
application = get_wsgi_application()

from django.conf import settings  # noqa: E402 - once the settings module is known

if settings.WARM_UP:
    from hindsight.warmup import warm_up

    warm_up(application)  # the first request as fast as the next (hindsight/warmup.py)
