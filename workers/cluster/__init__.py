"""A Ray cluster on AWS: the launcher YAML from a plan, the account's preflight, install, network and secrets."""
