package agent

import (
	"context"

	"agentkit/agent/sessiondb"
)

// checkpointAfterDelete truncates the write-ahead logs of the session
// database and, when it is the embedded default, of the default store, so
// the deleted session's token and messages do not linger in them. Both run
// with secure_delete, so the checkpointed pages hold zeros where the rows
// were. A checkpoint that cannot finish (a long read in another process)
// is logged; a later delete or SQLite's own checkpoints finish the job.
func (r *Runtime) checkpointAfterDelete(ctx context.Context, id string) {
	log := r.logger(id)
	if err := r.db.Checkpoint(ctx); err != nil {
		log.Warn("agent: checkpointing the session database after a delete failed", "error", err)
	}
	if r.ownStore != nil {
		if err := sessiondb.CheckpointFile(ctx, r.root.KVPath()); err != nil {
			log.Warn("agent: checkpointing the default store after a delete failed", "error", err)
		}
	}
}
