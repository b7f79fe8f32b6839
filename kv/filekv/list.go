package filekv

import (
	"context"
	"errors"
	"io/fs"
	"iter"
	"os"
	"slices"
	"strings"

	"agentkit/kv"
)

// found is one key a scan saw, with its file relative to the root.
type found struct {
	key string
	rel string
}

// List yields the entries under prefix in ascending bytewise key order.
//
// It first walks the folders that can hold such keys and collects their
// names, with writes paused so every key that exists is seen, sorts the
// decoded keys, then reads the files one by one as the caller iterates.
// A key deleted after the walk is skipped; a key written after it may show
// its newer value.
func (s *store) List(ctx context.Context, prefix string) iter.Seq2[kv.Entry, error] {
	return s.ListAfter(ctx, prefix, "")
}

// ListAfter is List without the keys at or before after: the walk still
// visits the prefix's folders, but only the files of later keys are read.
func (s *store) ListAfter(ctx context.Context, prefix, after string) iter.Seq2[kv.Entry, error] {
	return func(yield func(kv.Entry, error) bool) {
		keys, err := s.scan(ctx, prefix, after)
		if err != nil {
			yield(kv.Entry{}, err)
			return
		}
		for _, f := range keys {
			v, err := s.readListed(ctx, f.rel)
			if errors.Is(err, kv.ErrNotFound) {
				continue // deleted since the walk
			}
			if err != nil {
				yield(kv.Entry{}, err)
				return
			}
			if !yield(kv.Entry{Key: f.key, Value: v}, nil) {
				return
			}
		}
	}
}

func (s *store) readListed(ctx context.Context, rel string) ([]byte, error) {
	if err := s.enter(); err != nil {
		return nil, err
	}
	defer s.leave()
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	v, _, err := s.read(rel)
	return v, err
}

// ListKeys yields the keys under prefix in ascending bytewise order without
// reading any file.
func (s *store) ListKeys(ctx context.Context, prefix string) iter.Seq2[string, error] {
	return s.ListKeysAfter(ctx, prefix, "")
}

// ListKeysAfter is ListKeys without the keys at or before after.
func (s *store) ListKeysAfter(ctx context.Context, prefix, after string) iter.Seq2[string, error] {
	return func(yield func(string, error) bool) {
		keys, err := s.scan(ctx, prefix, after)
		if err != nil {
			yield("", err)
			return
		}
		for _, f := range keys {
			if err := ctx.Err(); err != nil {
				yield("", err)
				return
			}
			if !yield(f.key, nil) {
				return
			}
		}
	}
}

// scan collects the keys under prefix that sort after after, sorted by key.
func (s *store) scan(ctx context.Context, prefix, after string) ([]found, error) {
	if err := s.enter(); err != nil {
		return nil, err
	}
	defer s.leave()
	// Writes rename files over existing names; on some file systems (tmpfs,
	// btrfs) a directory read running beside such a rename can miss the
	// name. Holding tree exclusively keeps the folders still while they
	// are read; it costs writers a pause of one directory walk.
	s.tree.Lock()
	defer s.tree.Unlock()
	segs := strings.Split(prefix, "/")
	full := segs[:len(segs)-1] // whole segments: folders to go straight to
	base := ""
	if len(full) > 0 {
		base = strings.Join(full, "/") + "/"
	}
	w := walker{s: s, ctx: ctx, prefix: prefix}
	if err := w.walk(dirPath(full), base, ""); err != nil {
		return nil, err
	}
	if after >= prefix {
		w.out = slices.DeleteFunc(w.out, func(f found) bool { return f.key <= after })
	}
	slices.SortFunc(w.out, func(a, b found) int { return strings.Compare(a.key, b.key) })
	return w.out, nil
}

type walker struct {
	s      *store
	ctx    context.Context
	prefix string
	out    []found
}

// walk collects the keys in the folder rel. base is the key text of the
// folder's whole segments (ending in '/', or empty), pending the text of a
// long segment's pieces seen so far.
func (w *walker) walk(rel, base, pending string) error {
	if err := w.ctx.Err(); err != nil {
		return err
	}
	f, err := os.Open(w.s.abs(rel))
	if errors.Is(err, fs.ErrNotExist) {
		return nil // no such folder (or removed while walking): no keys
	}
	if err != nil {
		return err
	}
	entries, err := f.ReadDir(-1)
	f.Close()
	if err != nil {
		return err
	}
	for _, e := range entries {
		name := e.Name()
		kind, text := classify(name, e.IsDir(), e.Type().IsRegular())
		child := joinRel(rel, name)
		switch kind {
		case kindFile:
			key := base + pending + text
			if strings.HasPrefix(key, w.prefix) && canonical(key, child) {
				w.out = append(w.out, found{key: key, rel: child})
			}
		case kindCont:
			if p := pending + text; w.compatible(base + p) {
				if err := w.walk(child, base, p); err != nil {
					return err
				}
			}
		case kindDir:
			if b := base + pending + text + "/"; w.compatible(b) {
				if err := w.walk(child, b, ""); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

// compatible reports whether keys starting with partial can start with the
// prefix.
func (w *walker) compatible(partial string) bool {
	return strings.HasPrefix(partial, w.prefix) || strings.HasPrefix(w.prefix, partial)
}

// canonical reports whether rel is exactly where this driver stores key, so
// files it did not write (or spelled differently) are never listed.
func canonical(key, rel string) bool {
	if kv.ValidateKey(key) != nil {
		return false
	}
	dir, name := keyPath(key)
	return joinRel(dir, name) == rel
}
