//go:build !unix

package workspace

// nonBlock is zero where named pipes do not block an open the same way.
const nonBlock = 0
