"""How this tool marks what it starts, so that a later run finds and ends only its own.

Containers carry the Docker labels; server and probe processes carry the environment variables
(``cleanup_stale``, ``bisect reset``: another bisect on the same host keeps its own).
"""

LABEL_TOOL = "bisect.tool"
LABEL_SESSION = "bisect.session"
LABEL_CANDIDATE = "bisect.candidate"
LABEL_LIFETIME = "bisect.lifetime"
TOOL_NAME = "bisect"
#: on every image the tool builds, its value the image's repository (bisect-base, bisect-builder,
#: bisect-demo-stack): `make docker-down` removes an image only where the two agree, since a
#: user's image built FROM one of ours inherits the label but not the repository
LABEL_IMAGE = "bisect.image"
#: set in every server's and probe's environment: finds the processes of a crashed run
ENV_SESSION = "BISECT_SESSION"
ENV_LIFETIME = "BISECT_LIFETIME"
