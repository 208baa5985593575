module gradserve.dev/examples/go

go 1.19

require gradserve.dev/client/go v0.0.0

replace gradserve.dev/client/go => ../../client/go
