"""Every HTTP request draftboard makes to another service (an engine's API, the alert webhook) goes
through one opener that follows no redirect: a server the deployment allowed cannot send the worker
to a URL nobody allowed (urllib's default opener follows 301/302/303/307/308), and what such a URL
answers never reaches a job's error or a page."""

from __future__ import annotations

import urllib.error
import urllib.request


class RedirectRefused(urllib.error.URLError):
    """A reply that redirects elsewhere: refused, never followed."""


class _RefuseRedirects(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, req, fp, code, msg, headers, newurl):
        raise RedirectRefused(f"answered HTTP {code}, a redirect; draftboard follows no redirect")


_OPENER = urllib.request.build_opener(_RefuseRedirects())


def open_url(request: urllib.request.Request | str, timeout: float):
    """`urllib.request.urlopen` without redirects: RedirectRefused (a URLError) for a 3xx reply."""
    return _OPENER.open(request, timeout=timeout)
