"""--enable-ssl-refresh (vLLM's): a renewed certificate is served without a restart.

The key, certificate and CA files are looked at once a second; when one has changed, the
server's SSL context loads them again, and every connection made after that gets the new
certificate (those already open keep theirs). A pair caught half-written does not load: the
old one stays, and the next change is tried again.
"""

from __future__ import annotations

import logging
import os
import ssl

log = logging.getLogger(__name__)


class CertificateWatch:
    def __init__(self, context: ssl.SSLContext, keyfile: str, certfile: str,
                 ca_certs: str | None):
        self.context = context
        self.keyfile, self.certfile, self.ca_certs = keyfile, certfile, ca_certs
        self.stamps = self._stamps()

    def _stamps(self) -> list[tuple[int, int] | None]:
        stamps: list[tuple[int, int] | None] = []
        for path in filter(None, (self.keyfile, self.certfile, self.ca_certs)):
            try:
                info = os.stat(path)
            except OSError:
                stamps.append(None)
            else:
                stamps.append((info.st_mtime_ns, info.st_size))
        return stamps

    def check(self) -> bool:
        """Load the files again if any changed since the last look; whether they loaded."""
        stamps = self._stamps()
        if stamps == self.stamps:
            return False
        self.stamps = stamps
        try:
            self.context.load_cert_chain(self.certfile, self.keyfile)
            if self.ca_certs is not None:
                self.context.load_verify_locations(self.ca_certs)
        except (OSError, ssl.SSLError) as exc:
            log.warning("TLS files changed but do not load; serving the previous ones",
                        extra={"certfile": self.certfile, "error": str(exc)})
            return False
        log.info("TLS certificate reloaded", extra={"certfile": self.certfile})
        return True
