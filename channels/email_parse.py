"""Reading a mail: who sent it (and whether the receiving server vouches for that), its new
text without the quoted earlier mail, its attachments, and the headers a reply threads by.

The From header is anyone's to write. What can be trusted is the ``Authentication-Results``
header (RFC 8601) that *our* receiving server adds, naming itself (``authserv-id``): DMARC
passed for the From domain, or DKIM passed for a domain aligned with it. A mail server strips
such headers claiming its own id from incoming mail, so only the topmost one with that id is
read, and it is parsed by ``authres`` (quoting and comments as the RFC says: a quoted
``smtp.mailfrom`` holding ``;dmarc=pass`` is one value, not a result).

A stranger's mail is read in two steps: the headers (``read_headers``: who sent it, whether it
is a robot's), which decide whether the body is read at all; then the body
(``read_body``), bounded in size, parts and nesting, and run off the event loop by the caller.
A mail that cannot be read is ``Unreadable``: recorded as such and passed over, never retried.
"""

from __future__ import annotations

import email
import email.policy
import re
from html import unescape
from email.message import Message
from email.parser import BytesHeaderParser
from dataclasses import dataclass, field
from email.message import EmailMessage
from email.utils import getaddresses

import authres
from markdownify import markdownify

# Where the quoted earlier mail starts: the line mail programs write above it ("On Mon, 1 Jan
# 2026, Ann <ann@x.org> wrote:", maybe over two lines; in German, French, Spanish, Italian, Dutch
# and Portuguese too), Outlook's header block ("From: ..." then "Sent: ...", in the same languages,
# bold when it came as HTML; not "Date:", which a traveller's "From: London / Date: 3 May" has)
# or separator, or a rule. Every part is bounded: the text is an allowed sender's, up to
# MAX_MAIL_BYTES. (mail-parser-reply knows more languages, but strips every line, code's
# indentation too, and took 11 s on "Sent from" and 50,000 spaces.) A forward is not cut: the
# mail below its header is what it brings.
_WROTE = (r"(?:On|Am|Le|El|Il|Op|Em)\b.{0,300}?"
          r"\b(?:wrote|schrieb|a écrit|escribió|ha scritto|schreef|escreveu)\b[^:\n]{0,100}:")
_OUTLOOK = (r"\**(?:From|Von|De|Da|Van) ?:\**[^\n]*\n[ \t]*"
            r"\**(?:Sent|Gesendet|Envoyé|Enviado|Inviato|Verzonden) ?:")
_FORWARD = re.compile(r"(?:fwd?|wg|tr|rv|enc|i|doorst|vs|vb|pd)\s*:", re.IGNORECASE)  # Fwd:, FW:, WG:, TR:...
# What mail programs put above a forwarded mail in the body (Gmail, Apple Mail, Thunderbird, Outlook).
_FORWARD_HEAD = re.compile(r"^(?:-{5,} ?Forwarded message ?-{5,}|Begin forwarded message:|-{5,} ?(?:Original|Forwarded) "
                           r"Message ?-{5,})\s*$", re.IGNORECASE | re.MULTILINE)
_QUOTE_HEAD = re.compile(rf"^(?:{_WROTE}\s*$|{_OUTLOOK}|(?:-{{2,}}\s*Original Message\s*-{{2,}}|_{{5,}})\s*$)",
                         re.IGNORECASE | re.MULTILINE | re.DOTALL)


MAX_MAIL_BYTES = 50 * 1024 * 1024  # a 25 MB attachment, base64-encoded, and some
MAX_PARTS = 100  # MIME parts (each "Content-Type"), nesting included
MAX_DEPTH = 10
MAX_HTML_CHARS = 300_000  # markdownify is slow on huge HTML: 3 MB took 56 s; the rest is cut


class Unreadable(ValueError):
    """A mail that is not read (too big, too many parts, too deep, broken): one line why."""


@dataclass
class Mail:
    sender: str  # the From address, lower case ("" when there is none)
    sender_name: str | None  # the From name: shown, never an identity
    subject: str
    message_id: str
    references: str  # the References chain a reply extends
    headers: Message  # the header block (Authentication-Results are read from it)
    auto: bool = False  # an auto-reply, a bounce or a list mail: never answered
    text: str = ""  # the new part of the body, as text (``read_body``)
    forwarded: bool = False  # it brings someone else's mail (``read_body``): outside content
    attachments: list[tuple[str, bytes]] = field(default_factory=list)  # (file name, bytes)

    def reply_context(self) -> dict[str, str]:
        """What a reply needs to stay in the thread (kept with the message, handed back with its reply)."""
        return {"subject": self.subject, "message_id": self.message_id, "references": self.references}


def read_headers(raw: bytes) -> Mail:
    """Who sent it and what it is, from the header block only (cheap, whatever the body holds).
    The subject is one line, and the ids are only what has an id's shape: an encoded header may
    decode to line breaks, which a reply's header cannot hold."""
    headers = BytesHeaderParser(policy=email.policy.default).parsebytes(raw)
    name, address = (getaddresses([str(headers.get("From", ""))]) or [("", "")])[0]
    message_id = next(iter(_message_ids(headers, "Message-ID")), "")
    subject = " ".join(str(headers.get("Subject", "")).split())
    return Mail(sender=address.strip().lower(), sender_name=name or None, subject=subject, message_id=message_id,
                references=" ".join([*_message_ids(headers, "References"), message_id]).strip(), headers=headers,
                auto=_automatic(headers, address))


def _message_ids(headers: Message, name: str) -> list[str]:
    """The ``<id>`` tokens of a header, for a reply's In-Reply-To and References: the same
    decoding may give line breaks, which a header cannot hold."""
    return re.findall(r"<[^<>\s]+>", str(headers.get(name, "")))


def _automatic(headers: Message, address: str) -> bool:
    """Sent by a robot (RFC 3834 Auto-Submitted, vacation replies' own marks, lists, bounces)."""
    return str(headers.get("Auto-Submitted", "no")).lower() != "no" or bool(headers.get("List-Id")) \
        or bool(headers.get("X-Autoreply") or headers.get("X-Autorespond")) \
        or str(headers.get("Precedence", "")).lower() in ("bulk", "list", "junk", "auto_reply") \
        or not address or address.lower().startswith(("mailer-daemon@", "postmaster@"))


def read_body(raw: bytes, mail: Mail) -> Mail:
    """``mail`` with its new text and attachments; Unreadable past the bounds. Slow on a big
    mail (the email package's parser): run it off the event loop."""
    if len(raw) > MAX_MAIL_BYTES:
        raise Unreadable(f"it is {len(raw) // 1048576} MB, over {MAX_MAIL_BYTES // 1048576} MB")
    parts = len(re.findall(rb"(?im)^content-type:", raw))
    if parts > MAX_PARTS:
        raise Unreadable(f"it has {parts} parts, over {MAX_PARTS}")
    try:
        message = email.message_from_bytes(raw, policy=email.policy.default)
        assert isinstance(message, EmailMessage)
        if _depth(message) > MAX_DEPTH:
            raise Unreadable(f"its parts nest deeper than {MAX_DEPTH}")
        text, forward = body_text(message), bool(_FORWARD.match(mail.subject))
        mail.forwarded = forward or bool(_FORWARD_HEAD.search(text))
        mail.text = text if forward else trim_quoted(text)
        mail.attachments = _attachments(message)
    except (LookupError, ValueError, TypeError, AttributeError, IndexError, RecursionError) as exc:
        raise Unreadable(f"it could not be parsed ({type(exc).__name__}: {exc})"[:300]) from None
    return mail


def _depth(part: Message, level: int = 0) -> int:
    if level > MAX_DEPTH or not part.is_multipart():
        return level
    return max((_depth(p, level + 1) for p in part.get_payload()), default=level)  # type: ignore[union-attr]


def body_text(message: EmailMessage) -> str:
    """The plain-text body, or the HTML one as text (Markdown-like: links and lists kept)."""
    part = message.get_body(preferencelist=("plain", "html"))
    if part is None:
        return ""
    try:
        content = part.get_content()
    except LookupError:  # an unknown charset: the bytes as UTF-8, what cannot be read replaced
        content = (part.get_payload(decode=True) or b"").decode("utf-8", errors="replace")
    if part.get_content_subtype() == "html":
        content = _html_text(content[:MAX_HTML_CHARS])
    return re.sub(r"\n{3,}", "\n\n", content.replace("\r\n", "\n")).strip()


def _html_text(html: str) -> str:
    """HTML as Markdown-like text; HTML nested too deep for markdownify (it recurses: about 330
    levels, which a newsletter's tables can reach) as its plain text, rather than not at all."""
    try:
        return markdownify(html, strip=["img", "script", "style"], heading_style="ATX")
    except RecursionError:
        return re.sub(r"[ \t]+", " ", unescape(re.sub(r"<[^>]*>", " ", html)))  # linear: no backtracking


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


def vouched(headers: Message, sender: str, authserv_id: str) -> bool:
    """Whether ``authserv_id``'s topmost Authentication-Results shows DMARC passed for the From
    domain, or DKIM passed for a domain aligned with it (the same, or its parent), and no DMARC
    result for that domain other than a pass (a later pass does not undo an earlier fail)."""
    domain = sender.rpartition("@")[2].lower()
    for header in headers.get_all("Authentication-Results") or []:
        try:
            parsed = authres.AuthenticationResultsHeader.parse(f"Authentication-Results: {header}")
        except Exception:  # authres raises its own SyntaxError kinds: a header it cannot read vouches for nothing
            if str(header).split(";")[0].strip().split()[:1] == [authserv_id]:
                return False
            continue
        if str(parsed.authserv_id).lower() != authserv_id.lower():
            continue
        return _passes(parsed.results, domain)  # only the topmost header of our own server counts
    return False


def _passes(results: list, domain: str) -> bool:
    dmarc = [r.result.lower() for r in results if r.method.lower() == "dmarc" and _prop(r, "header", "from") == domain]
    if any(result != "pass" for result in dmarc):
        return False
    if dmarc:
        return True
    for r in results:
        signer = _prop(r, "header", "d") or _prop(r, "header", "i").rpartition("@")[2]
        if r.method.lower() == "dkim" and r.result.lower() == "pass" and signer \
                and (domain == signer or domain.endswith("." + signer)):
            return True
    return False


def _prop(result, kind: str, name: str) -> str:
    for prop in result.properties:
        if prop.type.lower() == kind and prop.name.lower() == name:
            return str(prop.value).strip("<>@\"").lower()
    return ""
