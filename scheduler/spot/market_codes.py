"""Integer codes of the vectorised spot core (int8 arrays): the market a job holds and the decision
taken for it. One definition for the policy, the slack-value program and the simulator."""

NONE, SPOT, ON_DEMAND = 0, 1, 2  # the market a job holds
WAIT = NONE  # the decision to hold no market
# The decision, on on-demand with spot capacity, to boot a spot instance beside the running one and move
# the job once it is up (make-before-break): on-demand keeps working through the boot, and a boot whose
# capacity vanishes costs only the spot time it was billed. Not a market: the job holds ON_DEMAND meanwhile.
BOOT_SPOT = 3
