"""Who is labelling: the key that called, or, without keys, the name the labeller gave."""

from __future__ import annotations

from fastapi import HTTPException, status

from service.auth.keys import Principal
from service.contract.client_text import mask_text

ANONYMOUS_LABELLER = "anonymous"


def labeller_of(caller: Principal, named: str | None) -> tuple[str, str]:
    """(labeller id, display name) of who is labelling. A name given in a body arrives masked
    (``StorableBody``); a key's name is masked here, as it becomes a label's free text."""
    if caller.labeller is not None:
        if named is not None:
            raise HTTPException(
                status.HTTP_422_UNPROCESSABLE_CONTENT,
                detail="labeller is set by the API key; drop it from the body",
            )
        return caller.labeller, mask_text(caller.key_name)
    if named is None:
        return ANONYMOUS_LABELLER, ""
    return f"name:{named}", named
