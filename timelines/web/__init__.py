"""The REST API of an incident's events (``api``, ``serializers``) and of the incident page's
first view (``overview_api``): access, parameters and responses around the ``reads``."""
