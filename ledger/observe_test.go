package ledger

import (
	"context"
	"errors"
	"testing"
	"time"
)

// TestOnDeliverSeesEveryCall checks that OnDeliver is called once per
// Deliver with its answer, duration and error: an acknowledgement, a
// duplicate and a refusal.
func TestOnDeliverSeesEveryCall(t *testing.T) {
	type call struct {
		d    Delivery
		took time.Duration
		err  error
	}
	var calls []call
	block := make(chan struct{})
	c := newCluster(t, 1, func(o *Options) {
		o.MaxPending = 1
		o.OnDeliver = func(d Delivery, took time.Duration, err error) { calls = append(calls, call{d, took, err}) }
	})
	h := c.hosts[0]
	h.setHandler(func(ctx context.Context, tn *Turn) error { <-block; return commitEcho(ctx, tn) })
	ctx := context.Background()
	if _, err := h.l.Deliver(ctx, "s", msg("e1")); err != nil {
		t.Fatal(err)
	}
	h.l.Deliver(ctx, "s", msg("e1"))
	if _, err := h.l.Deliver(ctx, "s", msg("e2")); err == nil {
		// e1 is still pending (its turn is blocked): the inbox is full
		t.Fatal("a delivery past MaxPending was acknowledged")
	}
	close(block)
	if len(calls) != 3 {
		t.Fatalf("OnDeliver was called %d times for 3 deliveries", len(calls))
	}
	if c := calls[0]; c.err != nil || c.d.EventID != "e1" || c.d.Duplicate || c.took <= 0 {
		t.Errorf("first call %+v; want e1 acknowledged, with its duration", c)
	}
	if c := calls[1]; c.err != nil || !c.d.Duplicate {
		t.Errorf("second call %+v; want a duplicate", c)
	}
	if c := calls[2]; !errors.Is(c.err, ErrBusy) {
		t.Errorf("third call %+v; want ErrBusy", c)
	}
	st := h.l.Settings()
	if st.HostID != "h0" || st.Lease != 3*time.Second || st.Margin != 600*time.Millisecond || st.MaxPending != 1 ||
		st.MaxAttempts != DefaultMaxAttempts || st.DriftAllowance != DefaultDriftAllowance || st.MaxPendingBytes != DefaultMaxPendingBytes {
		t.Errorf("Settings %+v; want the options with the defaults filled in", st)
	}
}
