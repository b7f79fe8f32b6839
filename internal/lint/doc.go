// Package lint holds repository-wide checks that run with go test: every
// package has a doc comment, every exported name is documented, the
// portable packages link no driver or server client, every import of
// production code runs down the layers of the house (layers_test.go lists
// them, once, each with what it holds), and files are replaced only
// through internal/atomicfile.
package lint
