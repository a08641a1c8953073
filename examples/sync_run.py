"""The blocking facade, for code that is not async.

python examples/sync_run.py [STORE_URL]
"""

from __future__ import annotations

import sys
import time

import ai_lease
from ai_lease import Job

URL = sys.argv[1] if len(sys.argv) > 1 else "sqlite:///.ai-lease/examples.db"

record = ai_lease.run_sync(
    Job(f"sync-{time.time_ns()}", input="One job. From sync code."), store=URL
)
print(f"run_sync: {record.output!r}")

with ai_lease.SyncClient.connect(URL) as client:
    key = f"sync-client-{time.time_ns()}"
    print(f"SyncClient: {client.run(Job(key, input='Blocking calls. Own event loop.')).output!r}")
    status = client.status(key)
    print(f"status: {status.status if status else 'unknown'}")
