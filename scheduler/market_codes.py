"""Integer codes of the vectorised spot core (int8 arrays): the market a job holds and the decision
taken for it. One definition for the policy, the slack-value program and the simulator."""

NONE, SPOT, ON_DEMAND = 0, 1, 2  # the market a job holds
WAIT = NONE  # the decision to hold no market
