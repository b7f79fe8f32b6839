package agent

// subscriberBuffer is how many events a subscriber may fall behind before
// events are dropped for it.
const subscriberBuffer = 1024

// subscriber is one Subscribe call.
type subscriber struct {
	ch chan Event
}

// Subscribe returns a channel of the session's events as they are
// recorded (in serving mode ledger: as their turn commits, on any host),
// from now on, and a cancel function that ends the subscription
// and closes the channel. Subscribing does not check that the session
// exists: a subscriber can wait for a session's next turn.
//
// Events arrive in Seq order. A subscriber that falls more than 1024
// events behind misses events (never blocking the turn); it sees the gap
// in Seq and can fill it with Events. The channel is also closed when the
// session is deleted or the runtime closes.
func (r *Runtime) Subscribe(sessionID string) (<-chan Event, func()) {
	s := &subscriber{ch: make(chan Event, subscriberBuffer)}
	follow := r.path.follow(sessionID) // before the lock: it may read the store
	r.mu.Lock()
	if r.closed.Load() {
		r.mu.Unlock()
		close(s.ch)
		return s.ch, func() {}
	}
	set := r.subs[sessionID]
	if set == nil {
		set = map[*subscriber]struct{}{}
		r.subs[sessionID] = set
	}
	set[s] = struct{}{}
	follow()
	r.mu.Unlock()
	return s.ch, func() {
		r.mu.Lock()
		defer r.mu.Unlock()
		if set, ok := r.subs[sessionID]; ok {
			if _, ok := set[s]; ok {
				delete(set, s)
				close(s.ch)
				if len(set) == 0 {
					delete(r.subs, sessionID)
					r.path.unfollow(sessionID)
				}
			}
		}
	}
}

// publish hands an event to the session's subscribers without blocking.
func (r *Runtime) publish(ev Event) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for s := range r.subs[ev.SessionID] {
		select {
		case s.ch <- ev:
		default: // too far behind: this subscriber misses the event
		}
	}
}

// closeSubscribers ends every subscription of a session.
func (r *Runtime) closeSubscribers(sessionID string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for s := range r.subs[sessionID] {
		close(s.ch)
	}
	delete(r.subs, sessionID)
	r.path.unfollow(sessionID)
}

// closeAllSubscribers ends every subscription.
func (r *Runtime) closeAllSubscribers() {
	r.mu.Lock()
	defer r.mu.Unlock()
	for id, set := range r.subs {
		for s := range set {
			close(s.ch)
		}
		delete(r.subs, id)
		r.path.unfollow(id)
	}
}

// enter marks the start of an operation that Close must wait for. It
// fails with ErrClosed once Close has begun. Call the returned function
// when the operation ends. An operation may enter again (a tool calling a
// Runtime method): during Close the inner call fails instead of waiting.
func (r *Runtime) enter() (func(), error) {
	r.opMu.Lock()
	defer r.opMu.Unlock()
	if r.closed.Load() {
		return nil, ErrClosed
	}
	r.ops.Add(1)
	return r.ops.Done, nil
}
