"""Reading a mail: who sent it (and whether the receiving server vouches for that), its new
text without the quoted earlier mail, its attachments, and the headers a reply threads by.

The From header is anyone's to write. What can be trusted is the ``Authentication-Results``
header (RFC 8601) that *our* receiving server adds, naming itself (``authserv-id``): DMARC
passed for the From domain, or DKIM passed for a domain aligned with it. A mail server strips
such headers claiming its own id from incoming mail, so only the topmost one with that id is
read.
"""

from __future__ import annotations

import email
import email.policy
import re
from dataclasses import dataclass, field
from email.message import EmailMessage
from email.utils import getaddresses

from markdownify import markdownify

# Where the quoted earlier mail starts: "On Mon, 1 Jan 2026, Ann <ann@x.org> wrote:" (maybe over
# two lines), Outlook's separator, or a "From: ..." block after a rule.
_QUOTE_HEAD = re.compile(r"^(On\b.{0,300}?\bwrote:|-{2,}\s*Original Message\s*-{2,}|_{5,})\s*$",
                         re.IGNORECASE | re.MULTILINE | re.DOTALL)


@dataclass
class Mail:
    sender: str  # the From address, lower case ("" when there is none)
    sender_name: str | None
    subject: str
    message_id: str
    references: str  # the References chain a reply extends
    text: str  # the new part of the body, as text
    attachments: list[tuple[str, bytes]] = field(default_factory=list)  # (file name, bytes)
    auto: bool = False  # an auto-reply, a bounce or a list mail: never answered

    def reply_context(self) -> dict[str, str]:
        """What a reply needs to stay in the thread (kept with the message, handed back with its reply)."""
        return {"subject": self.subject, "message_id": self.message_id, "references": self.references}


def parse(raw: bytes) -> tuple[Mail, EmailMessage]:
    message = email.message_from_bytes(raw, policy=email.policy.default)
    assert isinstance(message, EmailMessage)
    name, address = (getaddresses([str(message.get("From", ""))]) or [("", "")])[0]
    references = " ".join(filter(None, [str(message.get("References", "")).strip(),
                                        str(message.get("Message-ID", "")).strip()]))
    auto = str(message.get("Auto-Submitted", "no")).lower() != "no" or bool(message.get("List-Id")) \
        or str(message.get("Precedence", "")).lower() in ("bulk", "list", "junk") \
        or not address or address.lower().startswith(("mailer-daemon@", "postmaster@"))
    mail = Mail(sender=address.strip().lower(), sender_name=name or None, subject=str(message.get("Subject", "")),
                message_id=str(message.get("Message-ID", "")).strip(), references=references,
                text=trim_quoted(body_text(message)), attachments=list(_attachments(message)), auto=auto)
    return mail, message


def body_text(message: EmailMessage) -> str:
    """The plain-text body, or the HTML one as text (Markdown-like: links and lists kept)."""
    part = message.get_body(preferencelist=("plain", "html"))
    if part is None:
        return ""
    content = part.get_content()
    if part.get_content_subtype() == "html":
        content = markdownify(content, strip=["img", "script", "style"], heading_style="ATX")
    return re.sub(r"\n{3,}", "\n\n", content.replace("\r\n", "\n")).strip()


def trim_quoted(text: str) -> str:
    """The new part of a reply: up to the quoted earlier mail, and no trailing "> " lines."""
    head = _QUOTE_HEAD.search(text)
    if head is not None and text[:head.start()].strip():
        text = text[:head.start()]
    lines = text.rstrip().split("\n")
    while lines and (lines[-1].startswith(">") or not lines[-1].strip()):
        lines.pop()
    return "\n".join(lines).strip() or text.strip()


def _attachments(message: EmailMessage) -> list[tuple[str, bytes]]:
    found = []
    for part in message.iter_attachments():
        data = part.get_payload(decode=True)
        if isinstance(data, bytes):
            found.append((part.get_filename() or "attachment", data))
    return found


def vouched(message: EmailMessage, sender: str, authserv_id: str) -> bool:
    """Whether ``authserv_id``'s Authentication-Results shows DMARC passed for the From domain,
    or DKIM passed for a domain aligned with it (the same, or its parent)."""
    domain = sender.rpartition("@")[2].lower()
    for header in message.get_all("Authentication-Results") or []:
        server, _, results = str(header).partition(";")
        names = server.split()
        if not names or names[0].lower() != authserv_id.lower():
            continue
        for result in results.split(";"):
            method = re.match(r"\s*(dmarc|dkim)\s*=\s*(\w+)", result, re.IGNORECASE)
            if method is None or method.group(2).lower() != "pass":
                continue
            props = dict((k.lower(), v.strip("<>@\"").lower())
                         for k, v in re.findall(r"(header\.(?:from|d|i))\s*=\s*(\S+)", result, re.IGNORECASE))
            if method.group(1).lower() == "dmarc" and props.get("header.from") == domain:
                return True
            signer = props.get("header.d") or props.get("header.i", "").rpartition("@")[2]
            if method.group(1).lower() == "dkim" and signer and (domain == signer or domain.endswith("." + signer)):
                return True
        return False  # only the topmost header of our own server counts
    return False
