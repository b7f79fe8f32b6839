package sqlitekv

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"agentkit/internal/proctest"
	"agentkit/kv"
)

// Child roles. Each opens the database named by SQLITEKV_PATH.

func childOpen() (*kv.DB, error) {
	db, err := Open(context.Background(), os.Getenv("SQLITEKV_PATH"), &Options{Synchronous: Synchronous(os.Getenv("SQLITEKV_SYNC"))})
	if err == nil {
		if n, _ := strconv.Atoi(os.Getenv("SQLITEKV_PAGE")); n > 0 {
			backend(db).pageRows, backend(db).keyPageRows = n, n
		}
	}
	return db, err
}

// childIncrement prints "ready", waits for "go", then increments the
// counter key with GetWithVersion/PutIfVersion until it has won
// SQLITEKV_WINS times, printing "won N" for each increment it made and
// finally "conflicts C".
func childIncrement() error {
	db, err := childOpen()
	if err != nil {
		return err
	}
	defer db.Close()
	wins, _ := strconv.Atoi(os.Getenv("SQLITEKV_WINS"))
	fmt.Println("ready")
	if _, err := proctest.ReadLine(bufio.NewReader(os.Stdin)); err != nil {
		return err
	}
	ctx := context.Background()
	conflicts := 0
	for won := 0; won < wins; {
		v, ver, err := db.GetWithVersion(ctx, "counter")
		if err != nil {
			return err
		}
		n, err := strconv.Atoi(string(v))
		if err != nil {
			return err
		}
		_, err = db.PutIfVersion(ctx, "counter", []byte(strconv.Itoa(n+1)), ver)
		switch {
		case errors.Is(err, kv.ErrConflict):
			conflicts++
			continue
		case err != nil:
			return err
		}
		won++
		fmt.Printf("won %d\n", n+1)
	}
	fmt.Printf("conflicts %d\n", conflicts)
	return nil
}

// TestTwoProcessesCASCounter races two processes incrementing one counter
// with PutIfVersion: every value from 1 to the total is won exactly once,
// and the counter ends at the number of successful increments.
func TestTwoProcessesCASCounter(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "kv.db")
	db := openT(t, path, &Options{Synchronous: SyncNormal})
	if _, err := db.PutIfAbsent(ctx, "counter", []byte("0")); err != nil {
		t.Fatal(err)
	}
	const wins = 150
	env := []string{"SQLITEKV_PATH=" + path, "SQLITEKV_SYNC=normal", "SQLITEKV_WINS=" + strconv.Itoa(wins)}
	a := proctest.Start(t, "incr", env...)
	b := proctest.Start(t, "incr", env...)
	a.Expect("ready", 30*time.Second)
	b.Expect("ready", 30*time.Second)
	a.Send("go")
	b.Send("go")
	won := map[int]int{}
	conflicts := 0
	for _, c := range []*proctest.Child{a, b} {
		lines, err := c.Wait()
		if err != nil {
			t.Fatalf("child %d: %v\n%s", c.PID(), err, c.Stderr())
		}
		mine := 0
		for _, l := range lines {
			var n int
			if _, err := fmt.Sscanf(l, "won %d", &n); err == nil {
				won[n]++
				mine++
			} else if _, err := fmt.Sscanf(l, "conflicts %d", &n); err == nil {
				conflicts += n
			}
		}
		if mine != wins {
			t.Errorf("child %d reported %d wins, want %d", c.PID(), mine, wins)
		}
	}
	for n := 1; n <= 2*wins; n++ {
		if won[n] != 1 {
			t.Errorf("the increment to %d was won %d times, want exactly once", n, won[n])
		}
	}
	v, err := db.Get(ctx, "counter")
	if err != nil || string(v) != strconv.Itoa(2*wins) {
		t.Fatalf("counter = %q (%v), want %d", v, err, 2*wins)
	}
	t.Logf("two processes made %d increments with %d conflicts between them", 2*wins, conflicts)
}

// childWriter prints "ready", then overwrites pre-existing keys, adds new
// ones and deletes them again until stdin closes, and prints "wrote N".
func childWriter() error {
	db, err := childOpen()
	if err != nil {
		return err
	}
	defer db.Close()
	var stop atomic.Bool
	go func() {
		os.Stdin.Read(make([]byte, 1)) // EOF when the parent is done
		stop.Store(true)
	}()
	fmt.Println("ready")
	ctx := context.Background()
	n := 0
	for i := 0; !stop.Load(); i++ {
		if err := db.Put(ctx, fmt.Sprintf("w/%05d", (i*37)%preKeys), []byte("overwritten")); err != nil {
			return err
		}
		nk := fmt.Sprintf("w/%05d-new-%d", (i*53)%preKeys, i)
		if err := db.Put(ctx, nk, []byte("new")); err != nil {
			return err
		}
		if i%2 == 0 {
			if err := db.Delete(ctx, nk); err != nil {
				return err
			}
		}
		n++
	}
	fmt.Printf("wrote %d\n", n)
	return nil
}

// preKeys is the number of keys that exist throughout the listings: many
// pages of SQLITEKV_PAGE rows.
const preKeys = 400

// childLister lists w/ repeatedly for a while, checking each listing holds
// every pre-existing key once and in order, and prints "listed N" (or
// returns the first failure).
func childLister() error {
	db, err := childOpen()
	if err != nil {
		return err
	}
	defer db.Close()
	ctx := context.Background()
	deadline := time.Now().Add(700 * time.Millisecond)
	listings := 0
	for listings < 3 || time.Now().Before(deadline) {
		var pre []string
		last := ""
		for e, err := range db.List(ctx, "w/") {
			if err != nil {
				return fmt.Errorf("listing %d: %w", listings, err)
			}
			if e.Key <= last {
				return fmt.Errorf("listing %d: %q after %q", listings, e.Key, last)
			}
			last = e.Key
			if !strings.Contains(e.Key, "-new-") {
				pre = append(pre, e.Key)
			}
		}
		if len(pre) != preKeys {
			return fmt.Errorf("listing %d saw %d of the %d keys that existed throughout", listings, len(pre), preKeys)
		}
		listings++
	}
	fmt.Printf("listed %d\n", listings)
	return nil
}

// TestListWhileAnotherProcessWrites runs a writer process and a lister
// process on one database: every listing succeeds (no "database is
// locked") and holds every key that existed throughout.
func TestListWhileAnotherProcessWrites(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "kv.db")
	db := openT(t, path, &Options{Synchronous: SyncNormal})
	for i := range preKeys {
		if err := db.Put(ctx, fmt.Sprintf("w/%05d", i), []byte("original")); err != nil {
			t.Fatal(err)
		}
	}
	env := []string{"SQLITEKV_PATH=" + path, "SQLITEKV_SYNC=full", "SQLITEKV_PAGE=37"}
	w := proctest.Start(t, "writer", env...)
	w.Expect("ready", 30*time.Second)
	l := proctest.Start(t, "lister", env...)
	lines, err := l.Wait()
	if err != nil {
		t.Fatalf("lister: %v\n%s", err, l.Stderr())
	}
	wl, werr := w.Wait()
	if werr != nil {
		t.Fatalf("writer: %v\n%s", werr, w.Stderr())
	}
	if len(lines) != 1 || !strings.HasPrefix(lines[0], "listed ") || len(wl) != 1 || !strings.HasPrefix(wl[0], "wrote ") {
		t.Fatalf("lister said %q, writer said %q", lines, wl)
	}
	var wrote int
	fmt.Sscanf(wl[0], "wrote %d", &wrote)
	if wrote == 0 {
		t.Fatal("the writer wrote nothing while the lister listed; the test proved nothing")
	}
	t.Logf("lister: %s; writer: %s", lines[0], wl[0])
	// The pre-existing keys are all still there for this process too.
	var keys []string
	for k, err := range db.ListKeys(ctx, "w/") {
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(k, "-new-") {
			keys = append(keys, k)
		}
	}
	if len(keys) != preKeys || !slices.IsSorted(keys) {
		t.Fatalf("after the run: %d pre-existing keys, want %d", len(keys), preKeys)
	}
}

func childCrash() error {
	db, err := childOpen()
	if err != nil {
		return err
	}
	return proctest.CrashWriter(db, os.Stdout)
}

// TestCrash kills a writing process with SIGKILL again and again; the
// database always reopens, passes SQLite's integrity check, and holds every
// acknowledged value (or a later one), whole.
func TestCrash(t *testing.T) {
	path := filepath.Join(t.TempDir(), "kv.db")
	proctest.RunCrash(t, proctest.Crash{
		Role:   "crash",
		Env:    []string{"SQLITEKV_PATH=" + path, "SQLITEKV_SYNC=full"},
		Cycles: 20,
		Open: func(t testing.TB) *kv.DB {
			db, err := Open(context.Background(), path, nil)
			if err != nil {
				t.Fatalf("reopen after the kill: %v", err)
			}
			return db
		},
		Check: func(t testing.TB, db *kv.DB) {
			var res string
			if err := backend(db).r.QueryRow("PRAGMA integrity_check").Scan(&res); err != nil || res != "ok" {
				t.Fatalf("integrity_check: %q, %v", res, err)
			}
		},
	})
}
