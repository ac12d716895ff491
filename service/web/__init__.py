"""The low HTTP floor: what every set of routes shares (the JSON API's and the dashboard's alike).

:mod:`service.web.errors` (an error with an HTTP status and the one JSON error shape),
:mod:`service.web.auth` (bearer-token checks) and :mod:`service.web.params` (strict integers from
URLs).  It imports only the root modules and ``service.db``; the API and the dashboard build on it,
so neither needs the other's modules.
"""
