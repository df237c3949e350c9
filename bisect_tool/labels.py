"""How this tool marks what it starts, so that a later run finds and ends only its own.

Containers carry the Docker labels; server and probe processes carry the environment variables
(``cleanup_stale``, ``bisect reset``: another bisect on the same host keeps its own).
"""

LABEL_TOOL = "bisect.tool"
LABEL_SESSION = "bisect.session"
LABEL_CANDIDATE = "bisect.candidate"
LABEL_LIFETIME = "bisect.lifetime"
TOOL_NAME = "bisect"
#: set in every server's and probe's environment: finds the processes of a crashed run
ENV_SESSION = "BISECT_SESSION"
ENV_LIFETIME = "BISECT_LIFETIME"
