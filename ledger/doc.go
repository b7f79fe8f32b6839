// Package ledger lets several hosts serve one agent's sessions from one
// shared store without losing or doubling a message.
package ledger
