"""Which messages our micro service endpoints take as requests.

A client that may create a JetStream consumer can have the server push stored messages to any
subject, an endpoint's included (the delivery subject is in the request's body, where no
permission reaches). Such a copy keeps the subject it was stored under, so it is told from a
request by that: an endpoint answers only what was published on its own subject.
"""

from __future__ import annotations

import logging

from nats.micro.request import Request

log = logging.getLogger(__name__)


def sent_to_endpoint(request: Request, endpoint_subject: str) -> bool:
    """Whether `request` was published on `endpoint_subject`; a copy pushed there is logged and dropped."""
    if request.subject == endpoint_subject:
        return True
    # %r: the stored subject may be any token a thread or environment id allows.
    log.warning("ignored a message on %s that a JetStream consumer pushed there from %r", endpoint_subject,
                request.subject[:200])
    return False
