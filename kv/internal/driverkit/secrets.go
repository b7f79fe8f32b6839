package driverkit

import (
	"errors"
	"net/url"
	"slices"
	"strings"
)

// Secrets are the credentials of one store (passwords, tokens), in every
// spelling they may take in an error message: as given, and escaped for a
// URL's query, path and user information.
type Secrets []string

// Add records a secret. The empty string is ignored.
func (s *Secrets) Add(secret string) {
	if secret == "" {
		return
	}
	for _, v := range []string{secret, url.QueryEscape(secret), url.PathEscape(secret), url.UserPassword("", secret).String()[1:]} {
		if !slices.Contains(*s, v) {
			*s = append(*s, v)
		}
	}
}

// Mask returns msg with every secret replaced by "[redacted]", and whether
// there was one.
func (s Secrets) Mask(msg string) (string, bool) {
	hit := false
	for _, sec := range s {
		if strings.Contains(msg, sec) {
			hit = true
			msg = strings.ReplaceAll(msg, sec, "[redacted]")
		}
	}
	return msg, hit
}

// Scrub returns err unless its message shows a secret; then it returns an
// error with the secrets masked that unwraps to nothing (the chain would
// show them again).
func (s Secrets) Scrub(err error) error {
	if err == nil {
		return nil
	}
	msg, hit := s.Mask(err.Error())
	if !hit {
		return err
	}
	return errors.New(msg)
}
