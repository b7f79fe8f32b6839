package kvtest

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"agentkit/kv"
)

// casChecks are the checks of the compare-and-set group.
func casChecks() []check {
	return []check{
		{"PutIfAbsentOnlyWhenAbsent", "PutIfAbsent writes only if the key does not exist; otherwise it fails with kv.ErrConflict (and kv.ErrExists) and changes nothing", needCAS, checkPutIfAbsent},
		{"PutIfVersionOnlyAtExpectedVersion", "PutIfVersion writes only if the key exists at the expected version; otherwise, a missing key included, it fails with kv.ErrConflict and changes nothing", needCAS, checkPutIfVersion},
		{"ReturnedVersionIsCurrent", "the Version a write returns equals what GetWithVersion returns next, until the key is written again", needCAS, checkReturnedVersion},
		{"IdenticalBytesChangeVersion", "every write gives the key a new version, a plain Put and identical bytes included (a content hash alone is not a version)", needCAS, checkIdenticalBytes},
		{"VersionsNeverReusedAfterDelete", "versions are never reused for a key, including after delete and re-create", needCAS | needDelete, checkNoReuse},
		{"PutIfAbsentAfterDelete", "after Delete, of an existing or a missing key, PutIfAbsent succeeds", needCAS | needDelete, checkPutIfAbsentAfterDelete},
		{"BadTokensConflict", "a garbage token, another key's token, a stale token and a token from before a delete and re-create are all conflicts", needCAS, checkBadTokens},
		{"TokenWorksAcrossClientsAndReopen", "a version token still works from a second client and after reopening the store", needCAS, checkTokenPortable},
		{"ConcurrentConditionalWritesOneWinner", "among concurrent conditional writes against one version (or absence) of a key exactly one wins, and the losers get kv.ErrConflict", needCAS, checkRace},
		{"ConcurrentConditionalWritesOneWinnerAcrossClients", "among concurrent conditional writes from independent clients against one version of a key exactly one wins", needCAS | needShared, checkRaceAcrossClients},
		{"DeleteOrderedWithConditionalWrites", "a Delete racing a conditional write is ordered with it: once both return, a PutIfVersion that won was followed by the delete (the key is gone), and a PutIfAbsent wins only if the delete came first", needCAS | needDelete, checkDeleteRaces},
		{"CASCounterCountsExactly", "a counter incremented by concurrent CAS loops ends at exactly the number of successful increments", needCAS, checkCounter},
		{"Linearizable", "a concurrent history of Get, Put, PutIfAbsent, PutIfVersion and Delete is linearizable", needCAS, checkLinearizable},
	}
}

// wantConflict checks err is a conflict.
func wantConflict(t testing.TB, op string, err error) {
	t.Helper()
	if !errors.Is(err, kv.ErrConflict) {
		if err == nil {
			t.Errorf("%s: succeeded, want an error matching kv.ErrConflict", op)
		} else {
			t.Errorf("%s: got %v, want an error matching kv.ErrConflict", op, err)
		}
	}
}

// current returns the value and version of key.
func current(t testing.TB, db *kv.DB, key string) ([]byte, kv.Version) {
	t.Helper()
	v, ver, err := db.GetWithVersion(t.Context(), key)
	if err != nil {
		t.Fatalf("GetWithVersion(%q): %v", key, err)
	}
	return v, ver
}

// wantCurrent checks key holds value at version ver.
func wantCurrent(t testing.TB, db *kv.DB, key string, value []byte, ver kv.Version) {
	t.Helper()
	v, got := current(t, db, key)
	if !bytesEqual(v, value) || got != ver {
		t.Errorf("GetWithVersion(%q): got %s at version %q, want %s at version %q", key, describe(v), got, describe(value), ver)
	}
}

func mustPutIfAbsent(t testing.TB, db *kv.DB, key string, value []byte) kv.Version {
	t.Helper()
	ver, err := db.PutIfAbsent(t.Context(), key, value)
	if err != nil {
		t.Fatalf("PutIfAbsent(%q) of a missing key: %v", key, err)
	}
	return ver
}

func mustPutIfVersion(t testing.TB, db *kv.DB, key string, value []byte, expected kv.Version) kv.Version {
	t.Helper()
	ver, err := db.PutIfVersion(t.Context(), key, value, expected)
	if err != nil {
		t.Fatalf("PutIfVersion(%q) with its current version %q: %v", key, expected, err)
	}
	return ver
}

func checkPutIfAbsent(t testing.TB, s *suite) {
	db := s.store(t)
	ctx := t.Context()
	v1 := mustPutIfAbsent(t, db, "k", []byte("one"))
	_, err := db.PutIfAbsent(ctx, "k", []byte("two"))
	wantConflict(t, "PutIfAbsent of an existing key", err)
	if !errors.Is(err, kv.ErrExists) {
		t.Errorf("PutIfAbsent of an existing key: got %v, want it to match kv.ErrExists too", err)
	}
	wantCurrent(t, db, "k", []byte("one"), v1)
	// A key created by a plain Put exists too (the first write without a
	// token must not overwrite).
	put(t, db, "p", []byte("plain"))
	_, pver := current(t, db, "p")
	_, err = db.PutIfAbsent(ctx, "p", []byte("clobber"))
	wantConflict(t, "PutIfAbsent of a key written by Put", err)
	wantCurrent(t, db, "p", []byte("plain"), pver)
	// Existence is per key, not per prefix.
	put(t, db, "parent/child", []byte("c"))
	mustPutIfAbsent(t, db, "parent", []byte("p"))
	mustPutIfAbsent(t, db, "k/child", []byte("c"))
	mustPutIfAbsent(t, db, "K", []byte("upper"))
	wantCurrent(t, db, "k", []byte("one"), v1)
}

func checkPutIfVersion(t testing.TB, s *suite) {
	db := s.store(t)
	ctx := t.Context()
	other := mustPutIfAbsent(t, db, "other", []byte("o"))
	_, err := db.PutIfVersion(ctx, "missing", []byte("v"), other)
	wantConflict(t, "PutIfVersion of a missing key", err)
	if s.has(needRead) {
		wantMissing(t, db, "missing")
	}
	v1 := mustPutIfAbsent(t, db, "k", []byte("one"))
	v2 := mustPutIfVersion(t, db, "k", []byte("two"), v1)
	wantCurrent(t, db, "k", []byte("two"), v2)
	_, err = db.PutIfVersion(ctx, "k", []byte("three"), v1)
	wantConflict(t, "PutIfVersion with the version before the last write", err)
	wantCurrent(t, db, "k", []byte("two"), v2)
	_, err = db.PutIfVersion(ctx, "k", []byte("three"), "")
	wantConflict(t, "PutIfVersion with the empty version", err)
	v3 := mustPutIfVersion(t, db, "k", []byte("three"), v2)
	wantCurrent(t, db, "k", []byte("three"), v3)
}

func checkReturnedVersion(t testing.TB, s *suite) {
	db := s.store(t)
	v1 := mustPutIfAbsent(t, db, "k", []byte("one"))
	wantCurrent(t, db, "k", []byte("one"), v1)
	wantCurrent(t, db, "k", []byte("one"), v1) // reading does not change it
	if s.caps.Get {
		mustRead(t, db, "k")
		wantCurrent(t, db, "k", []byte("one"), v1)
	}
	v2 := mustPutIfVersion(t, db, "k", []byte("two"), v1)
	wantCurrent(t, db, "k", []byte("two"), v2)
	put(t, db, "k", []byte("three"))
	_, v3 := current(t, db, "k")
	v4 := mustPutIfVersion(t, db, "k", []byte("four"), v3) // a version read after a plain Put works
	wantCurrent(t, db, "k", []byte("four"), v4)
	// Writing another key leaves this key's version alone.
	put(t, db, "k2", []byte("x"))
	mustPutIfAbsent(t, db, "k3", []byte("x"))
	wantCurrent(t, db, "k", []byte("four"), v4)
	seen := map[kv.Version]string{}
	for i, v := range []kv.Version{v1, v2, v3, v4} {
		if prev, dup := seen[v]; dup {
			t.Errorf("write %d of %q got version %q, already given to %s", i+1, "k", v, prev)
		}
		seen[v] = fmt.Sprintf("write %d", i+1)
	}
}

func checkIdenticalBytes(t testing.TB, s *suite) {
	db := s.store(t)
	ctx := t.Context()
	for _, same := range [][]byte{[]byte("same"), {}} {
		key := fmt.Sprintf("k%d", len(same))
		v1 := mustPutIfAbsent(t, db, key, same)
		put(t, db, key, same)
		_, v2 := current(t, db, key)
		if v2 == v1 {
			t.Errorf("a Put of identical bytes (%s) kept version %q", describe(same), v1)
		}
		v3 := mustPutIfVersion(t, db, key, same, v2)
		if v3 == v2 || v3 == v1 {
			t.Errorf("a PutIfVersion of identical bytes (%s) returned version %q, not new (earlier: %q, %q)", describe(same), v3, v1, v2)
		}
		put(t, db, key, same)
		_, v4 := current(t, db, key)
		if v4 == v3 || v4 == v2 || v4 == v1 {
			t.Errorf("a second Put of identical bytes returned version %q, not new (earlier: %q, %q, %q)", v4, v1, v2, v3)
		}
		// The stale tokens fence: a writer that read before the
		// identical-bytes write must lose.
		for _, stale := range []kv.Version{v1, v2, v3} {
			if stale == v4 {
				continue
			}
			_, err := db.PutIfVersion(ctx, key, []byte("stale writer"), stale)
			wantConflict(t, fmt.Sprintf("PutIfVersion with token %q from before an identical-bytes write", stale), err)
		}
		wantCurrent(t, db, key, same, v4)
	}
}

func checkNoReuse(t testing.TB, s *suite) {
	db := s.store(t)
	ctx := t.Context()
	seen := map[kv.Version]string{}
	note := func(v kv.Version, what string) {
		t.Helper()
		if prev, dup := seen[v]; dup {
			t.Errorf("%s got version %q, which %s had already been given", what, v, prev)
		}
		seen[v] = what
	}
	for cycle := range 5 {
		v := mustPutIfAbsent(t, db, "k", []byte("same"))
		note(v, fmt.Sprintf("PutIfAbsent in cycle %d", cycle))
		put(t, db, "k", []byte("same"))
		_, v = current(t, db, "k")
		note(v, fmt.Sprintf("Put in cycle %d", cycle))
		if err := db.Delete(ctx, "k"); err != nil {
			t.Fatalf("Delete: %v", err)
		}
		put(t, db, "k", []byte("same"))
		_, v = current(t, db, "k")
		note(v, fmt.Sprintf("Put after delete in cycle %d", cycle))
		if err := db.Delete(ctx, "k"); err != nil {
			t.Fatalf("Delete: %v", err)
		}
	}
	final := mustPutIfAbsent(t, db, "k", []byte("same"))
	note(final, "the final PutIfAbsent")
	for v, what := range seen {
		if v == final {
			continue
		}
		_, err := db.PutIfVersion(ctx, "k", []byte("stale"), v)
		wantConflict(t, fmt.Sprintf("PutIfVersion with the token of %s, before a delete and re-create", what), err)
	}
	wantCurrent(t, db, "k", []byte("same"), final)
}

func checkPutIfAbsentAfterDelete(t testing.TB, s *suite) {
	db := s.store(t)
	ctx := t.Context()
	if err := db.Delete(ctx, "k"); err != nil {
		t.Fatalf("Delete of a missing key: %v", err)
	}
	v1 := mustPutIfAbsent(t, db, "k", []byte("one"))
	if err := db.Delete(ctx, "k"); err != nil {
		t.Fatalf("Delete: %v", err)
	}
	v2 := mustPutIfAbsent(t, db, "k", []byte("two"))
	wantCurrent(t, db, "k", []byte("two"), v2)
	if v1 == v2 {
		t.Errorf("re-creating %q after delete gave the old version %q again", "k", v1)
	}
	_, err := db.PutIfVersion(ctx, "k", []byte("x"), v1)
	wantConflict(t, "PutIfVersion with the token from before delete and re-create", err)
	// A key deleted twice, then re-created.
	put(t, db, "j", []byte("j"))
	for range 2 {
		if err := db.Delete(ctx, "j"); err != nil {
			t.Fatalf("Delete: %v", err)
		}
	}
	mustPutIfAbsent(t, db, "j", []byte("again"))
}

// garbageTokens are version tokens no driver should ever issue.
var garbageTokens = []kv.Version{
	"garbage", "0", "1", "2", "-1", "00", "*", `"*"`, `W/"x"`, `""`, " ", "null", "undefined",
	"' OR '1'='1", "1; DROP TABLE kv", "%", "_", "\x00", "\xff", "é",
	kv.Version(strings.Repeat("9", 1000)),
}

func checkBadTokens(t testing.TB, s *suite) {
	db := s.store(t)
	ctx := t.Context()
	v1 := mustPutIfAbsent(t, db, "k", []byte("one"))
	vOther := mustPutIfAbsent(t, db, "other", []byte("o"))
	stale := v1
	cur := mustPutIfVersion(t, db, "k", []byte("two"), v1)
	bad := append([]kv.Version{}, garbageTokens...)
	bad = append(bad, cur+"x", "x"+cur, kv.Version(strings.ToUpper(string(cur))), kv.Version(strings.ToLower(string(cur))), `"`+cur+`"`, cur+" ")
	for _, g := range bad {
		if g == cur {
			continue // a case change or such may leave the token as it was
		}
		_, err := db.PutIfVersion(ctx, "k", []byte("garbage"), g)
		wantConflict(t, fmt.Sprintf("PutIfVersion with the garbage token %q", g), err)
	}
	wantCurrent(t, db, "k", []byte("two"), cur)
	if vOther != cur {
		_, err := db.PutIfVersion(ctx, "k", []byte("foreign"), vOther)
		wantConflict(t, "PutIfVersion with another key's token", err)
	}
	_, err := db.PutIfVersion(ctx, "k", []byte("stale"), stale)
	wantConflict(t, "PutIfVersion with a stale token of the same key", err)
	_, err = db.PutIfVersion(ctx, "never-written", []byte("x"), cur)
	wantConflict(t, "PutIfVersion of a missing key with another key's token", err)
	wantCurrent(t, db, "k", []byte("two"), cur)
	if !s.caps.Delete {
		return
	}
	if err := db.Delete(ctx, "k"); err != nil {
		t.Fatalf("Delete: %v", err)
	}
	_, err = db.PutIfVersion(ctx, "k", []byte("x"), cur)
	wantConflict(t, "PutIfVersion of a deleted key with its last token", err)
	recreated := mustPutIfAbsent(t, db, "k", []byte("two"))
	for _, old := range []kv.Version{v1, cur} {
		_, err = db.PutIfVersion(ctx, "k", []byte("x"), old)
		wantConflict(t, fmt.Sprintf("PutIfVersion with token %q from before a delete and re-create", old), err)
	}
	wantCurrent(t, db, "k", []byte("two"), recreated)
}

func checkTokenPortable(t testing.TB, s *suite) {
	open := s.namespace(t)
	a := client(t, open)
	v1 := mustPutIfAbsent(t, a, "k", []byte("one"))
	cur := v1
	if s.h.Shared {
		b := client(t, open)
		v2 := mustPutIfVersion(t, b, "k", []byte("two"), v1)
		wantCurrent(t, a, "k", []byte("two"), v2)
		_, err := a.PutIfVersion(t.Context(), "k", []byte("stale"), v1)
		wantConflict(t, "PutIfVersion from the first client with a token the second client superseded", err)
		cur = v2
		if err := b.Close(); err != nil {
			t.Errorf("closing the second client: %v", err)
		}
	}
	if err := a.Close(); err != nil {
		t.Errorf("closing the client: %v", err)
	}
	c := client(t, open)
	if c == a {
		t.Logf("the Opener returns one shared *kv.DB; reopening is not exercised")
		return
	}
	want := []byte("one")
	if s.h.Shared {
		want = []byte("two")
	}
	wantCurrent(t, c, "k", want, cur)
	v3 := mustPutIfVersion(t, c, "k", []byte("three"), cur)
	wantCurrent(t, c, "k", []byte("three"), v3)
	if v1 != cur {
		_, err := c.PutIfVersion(t.Context(), "k", []byte("stale"), v1)
		wantConflict(t, "PutIfVersion after reopening with a superseded token", err)
	}
}

// raceRounds runs rounds of n concurrent PutIfVersion calls against one
// version and n concurrent PutIfAbsent calls against one missing key,
// spreading the calls over clients. Each round must have exactly one winner.
func raceRounds(t testing.TB, clients []*kv.DB, rounds, n int) {
	t.Helper()
	ctx := t.Context()
	db := clients[0]
	type result struct {
		ver kv.Version
		err error
	}
	race := func(call func(g int, db *kv.DB) (kv.Version, error)) []result {
		res := make([]result, n)
		var (
			wg    sync.WaitGroup
			ready sync.WaitGroup
			start = make(chan struct{})
		)
		ready.Add(n)
		for g := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				c := clients[g%len(clients)]
				ready.Done()
				<-start
				v, err := call(g, c)
				res[g] = result{v, err}
			}()
		}
		ready.Wait()
		close(start)
		wg.Wait()
		return res
	}
	judge := func(what, key string, res []result) {
		t.Helper()
		winner := -1
		var wins []int
		for g, r := range res {
			switch {
			case r.err == nil:
				wins = append(wins, g)
				winner = g
			case !errors.Is(r.err, kv.ErrConflict):
				t.Errorf("%s: writer %d got %v, want success or kv.ErrConflict", what, g, r.err)
			}
		}
		if len(wins) != 1 {
			t.Fatalf("%s: %d of %d concurrent conditional writes succeeded (writers %v); exactly one must", what, len(wins), n, wins)
		}
		want := fmt.Sprintf("%s writer %d", key, winner)
		wantCurrent(t, db, key, []byte(want), res[winner].ver)
	}
	key := "race"
	ver := mustPutIfAbsent(t, db, key, []byte("start"))
	for round := range rounds {
		expected := ver
		res := race(func(g int, c *kv.DB) (kv.Version, error) {
			return c.PutIfVersion(ctx, key, []byte(fmt.Sprintf("%s writer %d", key, g)), expected)
		})
		judge(fmt.Sprintf("round %d of PutIfVersion against version %q", round, expected), key, res)
		_, ver = current(t, db, key)
	}
	for round := range rounds {
		k := fmt.Sprintf("absent-%d", round)
		res := race(func(g int, c *kv.DB) (kv.Version, error) {
			return c.PutIfAbsent(ctx, k, []byte(fmt.Sprintf("%s writer %d", k, g)))
		})
		judge(fmt.Sprintf("round %d of PutIfAbsent on missing key %q", round, k), k, res)
	}
}

func checkRace(t testing.TB, s *suite) {
	raceRounds(t, []*kv.DB{s.store(t)}, 10, 8)
}

func checkRaceAcrossClients(t testing.TB, s *suite) {
	a, b := s.twoClients(t)
	raceRounds(t, []*kv.DB{a, b}, 10, 8)
}

func checkCounter(t testing.TB, s *suite) {
	a, b := s.twoClients(t)
	clients := []*kv.DB{a, b}
	ctx := t.Context()
	const (
		workers    = 4
		increments = 25
		maxTries   = 100000
	)
	mustPutIfAbsent(t, a, "counter", []byte("0"))
	var (
		wg        sync.WaitGroup
		mu        sync.Mutex
		successes int
		failure   error
	)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			db := clients[w%2]
			fail := func(err error) {
				mu.Lock()
				if failure == nil {
					failure = err
				}
				mu.Unlock()
			}
			for range increments {
				for try := 0; ; try++ {
					if try == maxTries {
						fail(fmt.Errorf("worker %d: no increment succeeded in %d tries", w, maxTries))
						return
					}
					v, ver, err := db.GetWithVersion(ctx, "counter")
					if err != nil {
						fail(err)
						return
					}
					n, err := strconv.Atoi(string(v))
					if err != nil {
						fail(fmt.Errorf("the counter holds %s, not a number", describe(v)))
						return
					}
					_, err = db.PutIfVersion(ctx, "counter", []byte(strconv.Itoa(n+1)), ver)
					if errors.Is(err, kv.ErrConflict) {
						continue
					}
					if err != nil {
						fail(err)
						return
					}
					mu.Lock()
					successes++
					mu.Unlock()
					break
				}
			}
		}()
	}
	wg.Wait()
	if failure != nil {
		t.Fatalf("incrementing: %v", failure)
	}
	v, _ := current(t, a, "counter")
	if string(v) != strconv.Itoa(successes) {
		t.Errorf("after %d successful CAS increments the counter holds %s; increments were lost or doubled", successes, describe(v))
	}
	if successes != workers*increments {
		t.Errorf("%d increments succeeded, want %d", successes, workers*increments)
	}
}

// checkDeleteRaces races a Delete from one client against a conditional
// write from another, round after round, and checks that the two were
// ordered. Three kinds of round: a PutIfVersion of an existing key (once
// both return, a winning write was followed by the delete, so the key is
// gone), a PutIfAbsent of an existing key (it wins only if the delete came
// first, and then the key holds its value), and a PutIfAbsent of a key
// deleted before the round (absent all along, so it must win). A server
// that removes objects outside the lock of its conditional writes
// (versitygw's DeleteObject) breaks the first; jetstream's own Create broke
// the last: it read a delete marker's revision, lost to the next marker,
// and reported "exists" for an absent key.
func checkDeleteRaces(t testing.TB, s *suite) {
	a, b := s.twoClients(t)
	ctx := t.Context()
	const rounds = 48
	for round := range rounds {
		kind := round % 3
		key := fmt.Sprint("del/", round)
		t0 := time.Now()
		ver := mustPutIfAbsent(t, a, key, []byte("old"))
		if kind == 2 {
			if err := b.Delete(ctx, key); err != nil {
				t.Fatalf("round %d: Delete: %v", round, err)
			}
		}
		// The delete starts later by 0 to 2.6 times a write's time, swept
		// over the rounds, so it lands at every point of the conditional
		// write's progress (a driver's create may take three round trips),
		// where a broken store has its window.
		lag := time.Since(t0) * time.Duration(round/3%8) * 3 / 8
		var (
			wg         sync.WaitGroup
			werr, derr error
			start      = make(chan struct{})
		)
		write := func() {
			defer wg.Done()
			<-start
			if kind == 0 {
				_, werr = a.PutIfVersion(ctx, key, []byte("new"), ver)
			} else {
				_, werr = a.PutIfAbsent(ctx, key, []byte("new"))
			}
		}
		del := func() {
			defer wg.Done()
			<-start
			time.Sleep(lag)
			derr = b.Delete(ctx, key)
		}
		// The goroutine started last tends to run first: alternate, so
		// each side gets the head start in half the rounds.
		wg.Add(2)
		if round/2%2 == 0 {
			go write()
			go del()
		} else {
			go del()
			go write()
		}
		close(start)
		wg.Wait()
		if derr != nil {
			t.Fatalf("round %d: Delete: %v", round, derr)
		}
		if werr != nil && !errors.Is(werr, kv.ErrConflict) {
			t.Fatalf("round %d: the conditional write: %v, want success or kv.ErrConflict", round, werr)
		}
		v, err := read(ctx, a, key)
		present := err == nil
		if err != nil && !errors.Is(err, kv.ErrNotFound) {
			t.Fatalf("round %d: reading %q: %v", round, key, err)
		}
		switch {
		case kind == 0 && present:
			t.Fatalf("round %d: PutIfVersion (error %v) and Delete both returned, yet %q holds %s: the write landed after the delete", round, werr, key, describe(v))
		case kind == 1 && (werr == nil) != (present && string(v) == "new"):
			t.Fatalf("round %d: PutIfAbsent of an existing key racing its Delete returned %v, and afterwards %q is present=%v (%s): a create wins only after the delete, and then the key holds its value", round, werr, key, present, describe(v))
		case kind == 2 && werr != nil:
			t.Fatalf("round %d: PutIfAbsent of a key deleted before the round, racing another Delete, failed: %v; the key was absent all along", round, werr)
		}
	}
}
