package reminder

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"agentkit/internal/atomicfile"
	"agentkit/internal/privfile"
	"agentkit/record"
	"agentkit/storage"
)

// localRecord is a reminder as kept in the local folder: the stored record
// plus what this host still owes the store, in the record layer's codec.
type localRecord struct {
	Reminder
	// Unsynced says the store has not yet taken this state (its write
	// failed); Sync pushes it.
	Unsynced bool `json:"unsynced,omitempty"`
	// Stored says the store has held this reminder (some version of it).
	// One that has not (created before a store was configured) is written
	// to the store by Sync instead of being taken for deleted.
	Stored bool `json:"stored,omitempty"`
	// seen is when this copy was last known to be in the store (zero when
	// loaded from disk: before anything this process did).
	seen time.Time
}

// localDir keeps one JSON file per reminder in a folder. Writes replace the
// file atomically (atomicfile: a temporary file renamed over it). When the
// local copy is the only durable one (no store, or a state the store has
// not taken) the file and its folder are synced to disk; otherwise the
// store holds the truth and the local file is a cache, so the cost of fsync
// is spared.
type localDir struct {
	dir    string
	noSync bool // a store holds the truth
}

var safeName = regexp.MustCompile(`^[A-Za-z0-9_-]{1,100}$`)

// fileName is the file holding id: the id itself when it is a plain name,
// else a digest.
func fileName(id string) string {
	if safeName.MatchString(id) {
		return id + ".json"
	}
	sum := sha256.Sum256([]byte(id))
	return "sha256-" + hex.EncodeToString(sum[:]) + ".json"
}

func openLocal(dir string) (*localDir, error) {
	if dir == "" {
		return nil, errors.New("reminder: no local folder; set Options.Dir (the runtime uses --state-root/reminders)")
	}
	if err := os.MkdirAll(dir, privfile.DirPerm); err != nil {
		return nil, fmt.Errorf("reminder: cannot create the local folder: %w", err)
	}
	// Reminders hold messages: the folder is the owner's alone, and so is
	// every file in it (made so by CreateTemp, or when load finds one).
	if err := privfile.Tighten(dir); err != nil {
		return nil, fmt.Errorf("reminder: %w", err)
	}
	return &localDir{dir: dir}, nil
}

// load reads every record. Unreadable ones are reported in bad and left in
// place.
func (l *localDir) load() (recs []localRecord, bad []error, err error) {
	ents, err := os.ReadDir(l.dir)
	if err != nil {
		return nil, nil, fmt.Errorf("reminder: cannot read the local folder: %w", err)
	}
	for _, e := range ents {
		name := e.Name()
		if !e.Type().IsRegular() || !strings.HasSuffix(name, ".json") || strings.HasPrefix(name, ".") {
			continue
		}
		if err := privfile.Tighten(filepath.Join(l.dir, name)); err != nil {
			bad = append(bad, fmt.Errorf("reminder: %s: %w", name, err))
			continue
		}
		b, err := os.ReadFile(filepath.Join(l.dir, name))
		if err != nil {
			bad = append(bad, fmt.Errorf("reminder: %s: %w", name, err))
			continue
		}
		var lr localRecord
		_, err = record.Unmarshal(storage.KindReminder, filepath.Join(l.dir, name), b, &lr)
		if err == nil {
			err = lr.Reminder.Check()
		}
		if err != nil {
			bad = append(bad, fmt.Errorf("reminder: local file %s skipped: %w", name, err))
			continue
		}
		recs = append(recs, lr)
	}
	return recs, bad, nil
}

func (l *localDir) save(lr localRecord) error {
	b, err := record.Marshal(storage.KindReminder, lr)
	if err != nil {
		return err
	}
	name := filepath.Join(l.dir, fileName(lr.ID))
	if err := atomicfile.Write(name, b, &atomicfile.Options{NoSync: l.noSync && !lr.Unsynced}); err != nil {
		return fmt.Errorf("reminder: saving %s locally: %w", lr.ID, err)
	}
	return nil
}

func (l *localDir) remove(id string) error {
	err := os.Remove(filepath.Join(l.dir, fileName(id)))
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("reminder: removing %s locally: %w", id, err)
	}
	return nil
}
