package proctest

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"agentkit/kv"
)

// CycleEnv carries the crash cycle number to a CrashWriter child.
const CycleEnv = "AGENTKIT_KV_CRASH_CYCLE"

const crashKeys = 8

func crashKey(i int) string { return fmt.Sprintf("crash/d%d/k%d", i%3, i) }

// crashValue builds a self-validating value: "key cycle seq " and padding of
// a varying length, then the SHA-256 of all that.
func crashValue(key string, cycle, seq int) []byte {
	body := fmt.Appendf(nil, "%s %d %d ", key, cycle, seq)
	pad := (seq * 7919) % (48 << 10)
	body = append(body, bytes.Repeat([]byte{byte('a' + seq%26)}, pad)...)
	sum := sha256.Sum256(body)
	return append(body, sum[:]...)
}

// stamp is a write's place in the history: later cycles, then higher
// sequence numbers, are later.
type stamp struct{ cycle, seq int }

func (a stamp) less(b stamp) bool {
	return a.cycle < b.cycle || a.cycle == b.cycle && a.seq < b.seq
}

func (a stamp) String() string { return fmt.Sprintf("cycle %d seq %d", a.cycle, a.seq) }

// parseCrashValue checks a value's checksum and returns its key and stamp.
func parseCrashValue(v []byte) (string, stamp, error) {
	if len(v) < sha256.Size {
		return "", stamp{}, fmt.Errorf("torn value: %d bytes", len(v))
	}
	body, sum := v[:len(v)-sha256.Size], v[len(v)-sha256.Size:]
	if want := sha256.Sum256(body); !bytes.Equal(sum, want[:]) {
		return "", stamp{}, fmt.Errorf("torn value: checksum mismatch (%d bytes)", len(v))
	}
	f := strings.SplitN(string(body), " ", 4)
	if len(f) < 4 {
		return "", stamp{}, errors.New("value without its fields")
	}
	c, err1 := strconv.Atoi(f[1])
	s, err2 := strconv.Atoi(f[2])
	if err1 != nil || err2 != nil {
		return "", stamp{}, errors.New("value with bad numbers")
	}
	return f[0], stamp{c, s}, nil
}

// CrashWriter is the child half of RunCrash. It prints "ready", then puts
// values round-robin over a few keys forever, printing "ack KEY CYCLE SEQ"
// after each Put returns. It returns only on an error.
func CrashWriter(db *kv.DB, out io.Writer) error {
	cycle, err := strconv.Atoi(os.Getenv(CycleEnv))
	if err != nil {
		return fmt.Errorf("%s is not set", CycleEnv)
	}
	ctx := context.Background()
	if _, err := io.WriteString(out, "ready\n"); err != nil {
		return err
	}
	for seq := 0; ; seq++ {
		key := crashKey(seq % crashKeys)
		if err := db.Put(ctx, key, crashValue(key, cycle, seq)); err != nil {
			return err
		}
		if _, err := fmt.Fprintf(out, "ack %s %d %d\n", key, cycle, seq); err != nil {
			return err
		}
	}
}

// Crash configures RunCrash.
type Crash struct {
	// Role is the child role that opens the store and calls CrashWriter.
	Role string
	// Env is extra environment for the child (where the store is).
	Env []string
	// Open reopens the store in the test process after a kill; it must
	// succeed every time (a crashed writer never blocks the next opener).
	Open func(t testing.TB) *kv.DB
	// Check runs extra checks on the reopened store (optional).
	Check func(t testing.TB, db *kv.DB)
	// Cycles is the number of kills (at least 20 is a good start).
	Cycles int
}

// RunCrash kills a CrashWriter child with SIGKILL at random moments, Cycles
// times, and after each kill reopens the store and checks that every key
// holds a whole value (its checksum matches) that is the last one
// acknowledged for it or one written after it (at most two writes were not
// acknowledged yet: the one in flight and one whose ack was lost with the
// process).
func RunCrash(t *testing.T, c Crash) {
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 7))
	last := map[string]stamp{} // what each key must hold at least
	total, killedWriting := 0, 0
	for cycle := 1; cycle <= c.Cycles; cycle++ {
		child := Start(t, c.Role, append([]string{CycleEnv + "=" + strconv.Itoa(cycle)}, c.Env...)...)
		var firstAck string
		if rng.IntN(5) == 0 {
			// Sometimes kill at once, while the child may be opening.
			time.Sleep(time.Duration(rng.IntN(20)) * time.Millisecond)
		} else {
			// Otherwise kill while it writes: after its first
			// acknowledged write (however slow a loaded machine makes
			// it), at a random moment of the writes that follow.
			child.Expect("ready", 30*time.Second)
			firstAck = child.Expect("ack ", 30*time.Second)
			time.Sleep(time.Duration(rng.IntN(100)) * time.Millisecond)
		}
		child.Kill()
		lines, _ := child.Wait()
		if firstAck != "" {
			lines = append([]string{firstAck}, lines...)
		}
		maxSeq := -1
		for _, l := range lines {
			f := strings.Fields(l)
			if len(f) != 4 || f[0] != "ack" {
				continue // "ready", or a line cut by the kill
			}
			cy, err1 := strconv.Atoi(f[2])
			seq, err2 := strconv.Atoi(f[3])
			if err1 != nil || err2 != nil || cy != cycle {
				continue // the last line may be cut short
			}
			if s := (stamp{cy, seq}); last[f[1]].less(s) {
				last[f[1]] = s
			}
			maxSeq = max(maxSeq, seq)
			total++
		}
		if maxSeq >= 0 {
			killedWriting++
		}
		if strings.Contains(child.Stderr(), "proctest: role") {
			t.Fatalf("cycle %d: the writer failed on its own before the kill:\n%s", cycle, child.Stderr())
		}

		db := c.Open(t)
		ctx := context.Background()
		for i := range crashKeys {
			key := crashKey(i)
			v, err := db.Get(ctx, key)
			want, acked := last[key]
			if errors.Is(err, kv.ErrNotFound) {
				if acked {
					t.Fatalf("cycle %d: %s is missing after the kill, but %v was acknowledged", cycle, key, want)
				}
				continue
			}
			if err != nil {
				t.Fatalf("cycle %d: get %s after the kill: %v", cycle, key, err)
			}
			vk, got, err := parseCrashValue(v)
			if err != nil {
				t.Fatalf("cycle %d: %s: %v", cycle, key, err)
			}
			if vk != key {
				t.Fatalf("cycle %d: %s holds the value written for %s", cycle, key, vk)
			}
			if got.less(want) {
				t.Fatalf("cycle %d: %s holds %v, older than the acknowledged %v", cycle, key, got, want)
			}
			if want.less(got) && (got.cycle != cycle || got.seq > maxSeq+2) {
				t.Fatalf("cycle %d: %s holds %v, which the writer never started (last ack seq %d)", cycle, key, got, maxSeq)
			}
			last[key] = got
		}
		if c.Check != nil {
			c.Check(t, db)
		}
		if err := db.Close(); err != nil {
			t.Fatalf("cycle %d: close: %v", cycle, err)
		}
	}
	t.Logf("%d kills, %d while writing, %d acknowledged writes checked", c.Cycles, killedWriting, total)
	if killedWriting < c.Cycles/2 {
		t.Fatalf("only %d of %d kills hit a writing child; the test did not exercise crashes", killedWriting, c.Cycles)
	}
}
