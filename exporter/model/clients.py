"""What a client of the guard is called: the sources of its name and the form a name takes.

Shared by the guard (which names each request's client), its flags (`--guard.client-from`) and diagnose
(which reads the names back from the guard's access log), so it lives where all three may import it.
"""

from __future__ import annotations

import re

#: The sources of a client's name, in their order of preference.
CLIENT_SOURCES = ("header", "api-key", "user-agent", "address")
#: A client name: safe in a label, a JSON line and a terminal (the guard's names, and what diagnose accepts).
CLIENT_NAME = re.compile(r"[A-Za-z0-9._:@/+-]{1,64}")
