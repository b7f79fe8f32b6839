package agent

import (
	"context"
)

// checkpointAfterDelete truncates the write-ahead log of the session
// database (which holds the embedded default store too), so the deleted
// session's token and messages do not linger in it. It runs with
// secure_delete, so the checkpointed pages hold zeros where the rows were. A checkpoint that cannot finish (a long read in another process)
// is logged; a later delete or SQLite's own checkpoints finish the job.
func (r *Runtime) checkpointAfterDelete(ctx context.Context, id string) {
	log := r.logger(id)
	if err := r.db.Checkpoint(ctx); err != nil {
		log.Warn("agent: checkpointing the session database after a delete failed", "error", err)
	}
}
