"""Evidence for a release: information loss, workload error, queries, risk, empirical audits
and the HTML report. Read by stewards; never changes what is released.
"""
