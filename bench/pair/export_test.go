package pair

import "time"

// SetClock replaces the clock Loop reads until the returned func restores it.
func SetClock(f func() time.Time) (restore func()) {
	old := now
	now = f
	return func() { now = old }
}
