"""Independent reference implementations the tests check the package against."""
