// Package lint holds repository-wide checks that run with go test: every
// package has a doc comment, every exported name is documented, and the
// portable packages link no driver or server client.
package lint
