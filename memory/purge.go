package memory

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"agentkit/internal/atomicfile"
)

// SessionPurger is an optional interface of a MemoryBackend: PurgeSession
// removes every record of a session, for a session that is deleted. The
// Hook calls it from PurgeSession.
type SessionPurger interface {
	PurgeSession(ctx context.Context, sessionID string, info Info) error
}

var _ SessionPurger = (*Journal)(nil)

// purgeTempPrefix names the files a purge writes before renaming them over
// the journal files; Files never lists them, and a purge removes any left
// by one that was interrupted.
const purgeTempPrefix = ".purge-"

// PurgeSession removes the session's records from the journal (Purge). It
// implements SessionPurger.
func (j *Journal) PurgeSession(ctx context.Context, sessionID string, _ Info) error {
	_, err := j.Purge(ctx, sessionID)
	return err
}

// Purge removes every record of sessionID from the journal: the live file
// and the rotated ones. It returns the number of records removed.
//
// Each file that holds a record of the session is rewritten without them
// to a temporary file, synced, and renamed over it, so a reader or a crash
// sees the whole old file or the whole new one; a rotated file left empty
// is removed. Purge holds the journal's mutex and its flock for the whole
// pass, so appends from this Journal, other Journal values and other
// processes wait and then go to the new live file (they reopen it after a
// rename, as after a rotation): none is lost. A line that is not a
// complete record (one still being written when a process died) is kept.
// The bytes of removed records may stay in the file system's free blocks
// until they are reused.
func (j *Journal) Purge(ctx context.Context, sessionID string) (removed int, err error) {
	if sessionID == "" {
		return 0, errors.New("memory: Purge needs a session id")
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.closed {
		return 0, ErrClosed
	}
	if _, err := os.Stat(j.dir); errors.Is(err, fs.ErrNotExist) {
		return 0, nil // nothing was ever written
	}
	if err := j.acquire(); err != nil {
		return 0, err
	}
	defer func() {
		if uerr := unlockFile(j.lock); uerr != nil && err == nil {
			err = fmt.Errorf("memory: unlocking %s: %w", j.lockPath, uerr)
		}
	}()
	j.removeStaleTemps()
	files, err := Files(j.dir)
	if err != nil {
		return 0, err
	}
	changed := false
	for _, name := range files {
		if err := ctx.Err(); err != nil {
			return removed, err
		}
		n, err := purgeFile(name, filepath.Base(name) != JournalName, sessionID)
		removed += n
		if err != nil {
			return removed, err
		}
		changed = changed || n > 0
	}
	if changed {
		j.closeLive() // the live file may have been replaced: reopen it
		if err := syncDir(j.dir); err != nil {
			return removed, fmt.Errorf("memory: syncing %s: %w", j.dir, err)
		}
	}
	return removed, nil
}

// removeStaleTemps removes temporary files of an interrupted purge. The
// caller holds the flock.
func (j *Journal) removeStaleTemps() {
	entries, err := os.ReadDir(j.dir)
	if err != nil {
		return
	}
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), purgeTempPrefix) {
			os.Remove(filepath.Join(j.dir, e.Name()))
		}
	}
}

// purgeFile rewrites one journal file without sessionID's records and
// returns how many it removed. A rotated file left empty is removed.
func purgeFile(name string, rotated bool, sessionID string) (int, error) {
	f, err := os.Open(name)
	if errors.Is(err, fs.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("memory: %w", err)
	}
	defer f.Close()
	needle := []byte(sessionID)
	var kept bytes.Buffer
	removed := 0
	br := bufio.NewReaderSize(f, 64<<10)
	for {
		line, rerr := br.ReadBytes('\n')
		if len(line) > 0 {
			if bytes.Contains(line, needle) && recordOf(line, sessionID) {
				removed++
			} else {
				kept.Write(line)
			}
		}
		if rerr == io.EOF {
			break
		}
		if rerr != nil {
			return 0, fmt.Errorf("memory: reading %s: %w", name, rerr)
		}
	}
	if removed == 0 {
		return 0, nil
	}
	if rotated && kept.Len() == 0 {
		if err := os.Remove(name); err != nil {
			return 0, fmt.Errorf("memory: removing %s: %w", name, err)
		}
		return removed, nil
	}
	if err := atomicfile.Write(name, kept.Bytes(), &atomicfile.Options{Perm: filePerm, TempPrefix: purgeTempPrefix}); err != nil {
		return 0, fmt.Errorf("memory: purging %s: %w", name, err)
	}
	return removed, nil
}

// recordOf reports whether line is a complete record of sessionID.
func recordOf(line []byte, sessionID string) bool {
	if line[len(line)-1] != '\n' {
		return false // still being written: not a record yet
	}
	var r struct {
		SessionID *string `json:"sessionId"`
	}
	return json.Unmarshal(line, &r) == nil && r.SessionID != nil && *r.SessionID == sessionID
}

// syncDir fsyncs a folder, so renames and removals in it are durable.
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// PurgeSession removes the records of a deleted session: through the
// backend when it implements SessionPurger, and from the default journal's
// folder under the state root too when the backend is another one or
// memory is off (records written before stay readable through memory/).
// Unlike AfterTurn it returns its error: a delete that left the session's
// records readable should say so.
func (h *Hook) PurgeSession(ctx context.Context, sessionID string) error {
	if h == nil {
		return nil
	}
	var errs []error
	if p, ok := h.backend.(SessionPurger); ok {
		if err := guard(func() error { return p.PurgeSession(ctx, sessionID, h.info) }); err != nil {
			errs = append(errs, err)
		}
	}
	if h.owned == nil && h.info.StateRoot != "" {
		if j, err := NewJournal(Dir(h.info.StateRoot), nil); err == nil {
			_, err = j.Purge(ctx, sessionID)
			errs = append(errs, err, j.Close())
		}
	}
	return errors.Join(errs...)
}
