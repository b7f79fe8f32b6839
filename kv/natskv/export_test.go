package natskv

import "time"

// StallListings makes s's listings ignore the consumer's entries after
// the first n, as a stalled subscription would, and wait idle for the
// next entry before completing the listing another way.
func StallListings(s *Store, n int, idle time.Duration) {
	s.testStall, s.listIdle = n, idle
}
