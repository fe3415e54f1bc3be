"""Imported by the fork server only, as its first preload (:func:`.processes.warm_up`): it ties the
server's life to the driver's, so that the member processes forked from it die with the driver.

On Linux the import asks the kernel for SIGKILL when the server's parent, the driver, dies
(``PR_SET_PDEATHSIG``); each member process asks the same of the server, so a killed driver takes
the server and then every member with it, running jobs included (the server would otherwise stay
while any member holds its lifeline, and a member would finish its job with no driver to take it).
Never import it elsewhere: in any other process it would tie that process to its own parent.
"""

from __future__ import annotations

import os

from depthprobe.probes.engine.processes import die_with_parent

die_with_parent(os.getppid())
