"""Which messages our micro service endpoints take as requests.

A client that may create a JetStream consumer can have the server push stored messages to any
subject, an endpoint's included (the delivery subject is in the request's body, where no
permission reaches). Such a copy keeps the subject it was stored under, so it is told from a
request by that: an endpoint answers only what was published on its own subject.
"""

from __future__ import annotations

import logging

from nats.micro.request import Request

from bb_environments.domain.ids import quoted

log = logging.getLogger(__name__)


def sent_to_endpoint(request: Request, endpoint_subject: str) -> bool:
    """Whether `request` was published on `endpoint_subject`; a copy pushed there is logged and dropped."""
    if request.subject == endpoint_subject:
        return True
    log.warning(
        "ignored a message on %s that a JetStream consumer pushed there from %s",
        endpoint_subject,
        quoted(request.subject),
    )  # quoted: the stored subject carries ids a client chose
    return False
