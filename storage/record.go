package storage

import (
	"encoding/json"
	"fmt"
)

// FormatVersion is the format version ("v") of every record this package
// writes. A build refuses records with a higher version.
const FormatVersion = 1

// encodeRecord marshals a record, naming what it is in the error.
func encodeRecord(what string, rec any) ([]byte, error) {
	data, err := json.Marshal(rec)
	if err != nil {
		return nil, fmt.Errorf("storage: encoding the %s: %w", what, err)
	}
	return data, nil
}

// decodeRecord checks the format version of the record stored at key and
// unmarshals it into rec.
func decodeRecord(key string, data []byte, rec any) error {
	var head struct {
		V *int `json:"v"`
	}
	if err := json.Unmarshal(data, &head); err != nil {
		return fmt.Errorf("%w: the value at %q is not a JSON object (%v); it was not written by agentkit, or it is damaged", ErrBadRecord, key, err)
	}
	switch {
	case head.V == nil:
		return fmt.Errorf(`%w: the record at %q has no format version ("v"); it was not written by agentkit`, ErrBadRecord, key)
	case *head.V > FormatVersion:
		return fmt.Errorf("%w: the record at %q has format version %d, and this build reads versions up to %d; upgrade agentkit on this host", ErrNewerFormat, key, *head.V, FormatVersion)
	case *head.V < 1:
		return fmt.Errorf("%w: the record at %q has format version %d; versions start at 1", ErrBadRecord, key, *head.V)
	}
	if err := json.Unmarshal(data, rec); err != nil {
		return fmt.Errorf("%w: the record at %q does not decode: %v", ErrBadRecord, key, err)
	}
	return nil
}

// checkJSON rejects an empty or invalid JSON document before it is stored.
func checkJSON(what string, doc json.RawMessage) error {
	if len(doc) == 0 {
		return fmt.Errorf("storage: the %s is empty; pass a JSON document", what)
	}
	if !json.Valid(doc) {
		return fmt.Errorf("storage: the %s is not valid JSON", what)
	}
	return nil
}
