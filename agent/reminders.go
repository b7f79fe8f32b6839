package agent

import (
	"context"
	"errors"
	"fmt"
	"time"
	"unicode/utf8"

	"agentkit/agent/stateroot"
	"agentkit/reminder"
	"agentkit/tool"
)

// reminders runs the reminder scheduler (package reminder) for a runtime.
type reminders struct {
	s *reminder.Scheduler
}

// newReminders opens the scheduler over the state root's reminders/ folder
// and the store. start starts its loop.
func newReminders(ctx context.Context, r *Runtime) (*reminders, error) {
	host := r.cfg.Reminders.HostID
	if host == "" {
		host = r.hostID
	}
	s, err := reminder.Open(ctx, reminder.Options{
		Dir:          r.root.Path(stateroot.RemindersDir),
		Records:      r.agentStore.Reminders(),
		HostID:       host,
		Fire:         r.fireReminder,
		Lease:        r.cfg.Reminders.Lease,
		SyncInterval: r.cfg.Reminders.SyncInterval,
		Logger:       r.log,
	})
	if err != nil {
		return nil, fmt.Errorf("agent: reminders: %w", err)
	}
	return &reminders{s: s}, nil
}

// start runs the scheduler's loop until the runtime closes.
func (rm *reminders) start(r *Runtime) {
	r.bgWG.Add(1)
	go func() {
		defer r.bgWG.Done()
		if err := rm.s.Run(r.bg); err != nil {
			r.log.Error("agent: the reminder loop stopped", "error", err)
		}
	}()
}

// deleteSession removes the reminders of a session.
func (rm *reminders) deleteSession(ctx context.Context, sessionID string) error {
	for _, rem := range rm.s.List(sessionID) {
		if err := rm.s.Delete(ctx, rem.ID); err != nil && !errors.Is(err, reminder.ErrNotFound) {
			return storeErr("deleting the session's reminders", err)
		}
	}
	return nil
}

// forSession is the tool.Scheduler of a session.
func (rm *reminders) forSession(sessionID string) tool.Scheduler {
	return rm.s.ForSession(sessionID)
}

// fireReminder runs a due reminder as a follow-up turn in its session. The
// turn is not canceled when the runtime closes: Close waits for it. A
// reminder of a session deleted since counts as fired.
func (r *Runtime) fireReminder(ctx context.Context, rem reminder.Reminder) error {
	exit, err := r.enter()
	if err != nil {
		return err
	}
	defer exit()
	ctx = context.WithoutCancel(ctx)
	_, err = r.path.submit(ctx, turnRequest{sessionID: rem.SessionID, reminder: rem.ID, message: rem.Message, source: SourceReminder})
	if errors.Is(err, ErrSessionNotFound) {
		r.logger(rem.SessionID).Warn("agent: a reminder's session no longer exists; the reminder is dropped", "reminderId", rem.ID)
		return nil
	}
	return err
}

func reminderOf(rem reminder.Reminder) Reminder {
	return Reminder{ID: rem.ID, SessionID: rem.SessionID, At: rem.At, Message: rem.Message, State: string(rem.State), FiredAt: rem.FiredAt}
}

// CreateReminder schedules a follow-up turn in a session: at req.At, or
// req.Delay from now. The reminder is written to the store (awaited) and
// locally; it fires once, on one host. An unknown session is
// ErrSessionNotFound; bad input an *InvalidError; a store failure
// ErrStoreUnavailable.
func (r *Runtime) CreateReminder(ctx context.Context, req ReminderRequest) (Reminder, error) {
	exit, err := r.enter()
	if err != nil {
		return Reminder{}, err
	}
	defer exit()
	at := req.At
	switch {
	case req.SessionID == "":
		return Reminder{}, invalid("sessionId", "it is empty; name the session the reminder continues")
	case !at.IsZero() && req.Delay != 0:
		return Reminder{}, invalid("at", "give either at or delaySeconds, not both")
	case at.IsZero() && req.Delay < 0:
		return Reminder{}, invalid("delaySeconds", "it is negative; give a delay of zero or more")
	case at.IsZero():
		at = r.now().Add(req.Delay)
	case at.Year() < 1 || at.Year() > 9999:
		return Reminder{}, invalid("at", "%s is outside the years 1-9999", at.Format(time.RFC3339))
	}
	switch {
	case req.Message == "":
		return Reminder{}, invalid("message", "it is empty; give the text of the follow-up turn")
	case len(req.Message) > reminder.MaxMessageBytes:
		return Reminder{}, invalid("message", "it is %d bytes, over the %d-byte limit", len(req.Message), reminder.MaxMessageBytes)
	case !utf8.ValidString(req.Message):
		return Reminder{}, invalid("message", "it is not valid UTF-8")
	}
	if _, err := r.localOrStore(ctx, req.SessionID); err != nil {
		return Reminder{}, err
	}
	rem, err := r.reminders.s.Create(ctx, req.SessionID, at, req.Message)
	if err != nil {
		if errors.Is(err, reminder.ErrInvalid) {
			return Reminder{}, invalid("reminder", "%v", err)
		}
		return Reminder{}, storeErr("creating the reminder", err)
	}
	return reminderOf(rem), nil
}

// ListReminders returns the reminders of a session, or all of them when
// sessionID is empty, by due time. Fired and failed reminders stay listed
// for the scheduler's retention period.
func (r *Runtime) ListReminders(ctx context.Context, sessionID string) ([]Reminder, error) {
	exit, err := r.enter()
	if err != nil {
		return nil, err
	}
	defer exit()
	rems := r.reminders.s.List(sessionID)
	out := make([]Reminder, 0, len(rems))
	for _, rem := range rems {
		out = append(out, reminderOf(rem))
	}
	return out, nil
}

// DeleteReminder cancels a reminder here and in the store. An unknown id
// is ErrReminderNotFound; a store failure ErrStoreUnavailable.
func (r *Runtime) DeleteReminder(ctx context.Context, id string) error {
	exit, err := r.enter()
	if err != nil {
		return err
	}
	defer exit()
	if id == "" {
		return invalid("id", "it is empty")
	}
	switch err := r.reminders.s.Delete(ctx, id); {
	case errors.Is(err, reminder.ErrNotFound):
		return fmt.Errorf("%w: %s", ErrReminderNotFound, id)
	case err != nil:
		return storeErr("deleting the reminder", err)
	}
	return nil
}
